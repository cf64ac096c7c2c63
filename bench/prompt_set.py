"""A larger prompt set for drafter comparisons: 30 prompts each of code, factual QA and chat.

Code prompts mix writing new code with editing given code (where prompt lookup
shines: the answer repeats the prompt); QA asks for facts; chat is open-ended.
"""

_CODE_EDIT = '''def total_price(items):
    total = 0
    for item in items:
        total = total + item["price"] * item["quantity"]
    return total'''

_CODE_EDIT2 = '''class Counter:
    def __init__(self):
        self.counts = {}

    def add(self, word):
        if word in self.counts:
            self.counts[word] += 1
        else:
            self.counts[word] = 1'''

_CODE_EDIT3 = '''function fetchUser(id) {
  return fetch("/api/users/" + id)
    .then(response => response.json())
    .then(data => data.user);
}'''

CODE = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function that returns the factorial of n recursively.",
    "Write a Python function that removes duplicates from a list while keeping order.",
    "Write a Python function that counts word frequencies in a text.",
    "Write a Python function that converts Celsius to Fahrenheit.",
    "Write a Python function that finds the maximum value in a list without using max().",
    "Write a Python function that checks whether two strings are anagrams.",
    "Write a Python function that computes the greatest common divisor of two numbers.",
    "Write a Python class representing a bank account with deposit and withdraw methods.",
    "Write a Python function that reads a CSV file and returns a list of dictionaries.",
    "Write a Python function that transposes a matrix given as a list of lists.",
    "Write a Python function that returns all prime numbers below n using a sieve.",
    "Write a JavaScript function that debounces another function.",
    "Write a JavaScript function that deep-clones a plain object.",
    "Write a SQL query that counts orders per customer and sorts by the count.",
    "Write a Bash script that prints the ten largest files in a directory.",
    "Write a Python function that validates an email address with a regular expression.",
    "Write a Python generator that yields the Fibonacci sequence.",
    "Write a Python function that merges two dictionaries, summing values of shared keys.",
    "Write a C function that reverses a string in place.",
    "Add type hints and a docstring to this function:\n\n" + _CODE_EDIT,
    "Rewrite this function using sum() and a generator expression:\n\n" + _CODE_EDIT,
    "Rename the variable total to subtotal in this function and return the same result:\n\n" + _CODE_EDIT,
    "Add a method remove(word) to this class:\n\n" + _CODE_EDIT2,
    "Rewrite this class using collections.Counter, keeping the same methods:\n\n" + _CODE_EDIT2,
    "Add a docstring to every method of this class:\n\n" + _CODE_EDIT2,
    "Convert this function to async/await:\n\n" + _CODE_EDIT3,
    "Add error handling for a non-200 response to this function:\n\n" + _CODE_EDIT3,
    "Rewrite this function in Python using the requests library:\n\n" + _CODE_EDIT3,
    "Fix the bug in this function, which should return the average:\n\ndef average(xs):\n    return sum(xs) / len(xs) + 1",
]

QA = [
    "What is the capital of Canada?",
    "Who painted the Mona Lisa?",
    "What is the speed of light in a vacuum?",
    "How many bones are in the adult human body?",
    "What is the largest planet in the solar system?",
    "What does DNA stand for?",
    "When did the first humans land on the Moon?",
    "What is the chemical symbol for gold?",
    "Why do leaves change colour in autumn?",
    "What is the difference between weather and climate?",
    "How does a rainbow form?",
    "What is inflation in economics?",
    "Who developed the theory of general relativity?",
    "What is the tallest mountain on Earth?",
    "What is the function of the heart?",
    "How do bees make honey?",
    "What is the difference between a virus and a bacterium?",
    "What language is spoken in Brazil?",
    "What is the Pythagorean theorem?",
    "How does a refrigerator keep food cold?",
    "What is the longest river in the world?",
    "What causes earthquakes?",
    "What is the boiling point of water in Fahrenheit?",
    "Who was the first person to reach the South Pole?",
    "What is machine learning?",
    "How many continents are there, and what are they?",
    "What is the greenhouse effect?",
    "What is an atom made of?",
    "What is the purpose of the United Nations?",
    "How does compound interest work?",
]

CHAT = [
    "Hi! Can you help me pick a name for my new puppy? He is small and brown.",
    "I can't sleep well lately. Do you have any tips?",
    "Write a short birthday message for my grandmother.",
    "Suggest a quick healthy breakfast I can make in five minutes.",
    "I want to start running. How should I begin?",
    "Give me three ideas for a fun weekend with kids.",
    "Write a polite email declining a meeting invitation.",
    "Tell me something interesting about space.",
    "I'm bored. What should I do this evening?",
    "Help me write a toast for my best friend's wedding.",
    "What's a good book to read on a long flight?",
    "Write a haiku about autumn.",
    "How can I be more productive when working from home?",
    "Suggest a theme for a small dinner party.",
    "I'm learning to cook. What is an easy first recipe?",
    "Write a short motivational message for a friend starting a new job.",
    "Give me a fun fact about elephants.",
    "Recommend a hobby I can do indoors.",
    "Help me plan a relaxing Sunday.",
    "Write a thank-you message to a teacher.",
    "I feel stressed about exams. Any advice?",
    "Tell me a short story about a friendly robot.",
    "What are some good conversation starters at a party?",
    "Suggest a name for a cozy coffee shop.",
    "Write a short apology note for being late.",
    "How do I keep my houseplants alive?",
    "Give me a packing list for a weekend beach trip.",
    "Write a limerick about a cat.",
    "What can I do to make new friends in a new city?",
    "Suggest three ways to save money on groceries.",
]

PROMPT_SET: list[tuple[str, str]] = ([("code", p) for p in CODE] + [("qa", p) for p in QA]
                                     + [("chat", p) for p in CHAT])
