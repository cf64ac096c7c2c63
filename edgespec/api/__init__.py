"""edgespec in other APIs' shapes (the OpenAI HTTP API), as plain data: no HTTP, no gRPC."""
