"""The benchmark prompt set: code, factual QA and chat (sent through the chat template)."""

PROMPTS: list[tuple[str, str]] = [
    ("code", "Write a Python function that checks whether a number is prime."),
    ("code", "Write a Python function that returns the n-th Fibonacci number iteratively."),
    ("code", "Implement binary search over a sorted list in Python, returning the index or -1."),
    ("code", "Write a JavaScript function that reverses the words in a sentence."),
    ("qa", "What is the capital of Australia, and why was it chosen over Sydney and Melbourne?"),
    ("qa", "Explain what a hash table is and what the average time complexity of a lookup is."),
    ("qa", "What causes the seasons on Earth?"),
    ("qa", "What is the difference between TCP and UDP?"),
    ("chat", "Hi! Can you suggest a name for my new cat? She is black and very playful."),
    ("chat", "I feel tired after lunch every day. Any tips to stay focused in the afternoon?"),
    ("chat", "Write a short, friendly message inviting my team to a Friday lunch."),
    ("chat", "Tell me a fun fact about octopuses."),
]
