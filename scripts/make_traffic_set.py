"""Write autotune/bench/traffic.jsonl, the built-in traffic set: chat requests by category (chat, code, rewrite:
rewriting and summarising, math, extraction), each with the output length typical of its kind, from the material
below (written for autotune; nothing is downloaded). Deterministic: the same file every run.

    python scripts/make_traffic_set.py
"""
from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "autotune" / "bench" / "traffic.jsonl"

SYSTEM = ["You are a helpful assistant.", "You are a concise, friendly assistant.",
          "You are an assistant for a small software company. Answer clearly.", ""]

PASSAGES = [
    "hi team, quick update on the warehouse move. the movers are booked for the 14th and 15th of march, we need "
    "everyone to have their desks packed by the 13th at 5pm. labels are in the supply room, please put your name and "
    "new floor on every box. IT will disconnect the computers on the morning of the 14th so save your work the "
    "night before. parking at the new site is free for the first month, after that its 40 pounds a month. if you "
    "have questions ask Priya or me. thanks, Daniel",
    "The council met on Tuesday to discuss the proposed cycle lane on Harbour Road. Residents raised concerns about "
    "the loss of 32 parking spaces and about delivery vans stopping in the lane. The transport officer, Ms Okafor, "
    "said a trial had reduced accidents by a third on a similar road in Leeds. The council voted 7 to 4 to run a "
    "six-month trial starting in June, with a review of traffic counts and shop takings in December. The cost of "
    "the trial, 85,000 pounds, will come from the regional transport fund.",
    "Our new kettle boils one litre in under three minutes and switches itself off when the water boils or the jug "
    "is lifted. The body is brushed steel with a blue light that shows when it is heating. It has a removable "
    "limescale filter, a water window on both sides and a cord store in the base. Capacity is 1.7 litres. It comes "
    "with a two year warranty, and spare filters cost 6 pounds for a pack of three.",
    "Meeting notes 3 May. Present: Ana, Tom, Lee, Marta. Ana reported that sign-ups grew 12% in April but churn "
    "rose to 4.1%. Tom thinks the price change in March caused it. Lee will pull the cancellation survey results "
    "by Friday. Marta proposed a discount for annual plans; the group agreed to test it on 10% of new visitors from "
    "15 May. Next meeting 17 May at 10:00, Tom to chair.",
    "Bug report: when I export a project to PDF with more than 200 pages the app freezes at 99% and I have to force "
    "quit. It happens on version 4.2.1 on Windows 11, not on 4.1. Smaller exports work fine. The log shows 'out of "
    "memory in renderer' just before the freeze. I tried turning off image compression and it still happens. This "
    "is blocking our monthly report, can you look at it urgently?",
    "To make the soup, soften two chopped onions in butter for ten minutes. Add three diced potatoes, a litre of "
    "stock and a bay leaf, and simmer for twenty minutes until the potatoes are soft. Stir in two large handfuls of "
    "washed spinach and cook for two more minutes. Remove the bay leaf, blend until smooth, season with salt, pepper "
    "and a little nutmeg, and finish with a spoon of cream. Serves four.",
    "Dear Mr Alvarez, thank you for your application for the position of data analyst. We were impressed by your "
    "experience with forecasting models and would like to invite you to an interview on Thursday 22 June at 2pm at "
    "our office at 14 King Street, Bristol. The interview will last about an hour and will include a short "
    "exercise with a spreadsheet. Please confirm by replying to this email by Monday. Kind regards, Helen Shaw, "
    "Recruitment Manager",
    "Photosynthesis is the process by which green plants use light to turn carbon dioxide and water into sugar and "
    "oxygen. It takes place mainly in the leaves, inside chloroplasts, which contain the green pigment chlorophyll. "
    "The light-dependent reactions capture energy and split water, releasing oxygen. The Calvin cycle then uses that "
    "energy to fix carbon dioxide into sugars, which the plant uses for growth and stores as starch.",
    "Invoice 2231 from Northwind Supplies, dated 2 February 2024, to Blue Harbour Cafe, 8 Quay Street, Falmouth. "
    "Items: 12 boxes of paper cups at 4.50 each, 3 packs of napkins at 2.20 each, 1 coffee grinder at 189.00. "
    "Subtotal 249.60, VAT 49.92, total 299.52. Payment due within 30 days to account 44120987, sort code 20-45-77.",
    "The library will close for refurbishment from 1 August to 30 September. During the closure, books can be "
    "returned at the town hall reception, and the mobile library will visit the market square every Wednesday and "
    "Saturday morning. Online loans of e-books and audiobooks continue as usual. Fines will not be charged for items "
    "due during the closure. The reopened library will have a new children's area and twelve more study desks.",
    "I've been using the app for two years and overall I love it, but the last update made things worse. The new "
    "menu hides the settings I use every day, sync between my phone and laptop now takes minutes instead of seconds, "
    "and dark mode resets itself every time I restart. Support answered after a week with a generic reply. I'd give "
    "it five stars before, now maybe three. Please bring back the old layout or at least make it an option.",
    "Shipping policy: orders placed before 1pm on a working day are dispatched the same day. Standard delivery takes "
    "2 to 4 working days and costs 3.95, free on orders over 40. Express delivery arrives the next working day for "
    "6.95. We deliver to the UK, Ireland and the EU; EU orders may take up to 7 working days. Returns are free "
    "within 30 days if items are unused and in their original packaging.",
]

REWRITE = [
    ("Rewrite the following message in a clear, professional tone. Keep every fact.", 1.1),
    ("Fix the grammar, spelling and punctuation in this text, changing as little as possible:", 1.05),
    ("Rewrite this for a ten-year-old reader:", 1.0),
    ("Summarise the following in three bullet points:", 0.35),
    ("Summarize this in two sentences:", 0.25),
    ("Rewrite this text as a short, friendly announcement:", 0.8),
    ("Make this text shorter without losing any important detail:", 0.6),
    ("Proofread the following and return the corrected text only:", 1.05),
    ("Convert the following into a numbered list of steps or points:", 0.9),
]

EXTRACT = [
    "Extract every person's name, date and amount of money from the text below as a JSON object with the keys "
    "\"people\", \"dates\" and \"amounts\".",
    "Extract all dates and the event each refers to as a JSON list of {\"date\", \"event\"} objects.",
    "List all the numbers in this text with what each one measures, as JSON.",
    "Extract the key facts as JSON with the fields who, what, when, where and cost (null when absent).",
    "Pull out every action item and its owner as a JSON list of {\"task\", \"owner\", \"due\"}.",
]

CODE_TASKS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively, with type hints and a docstring.",
    "Write a Python function `chunked(items, size)` that yields lists of at most `size` items, with tests.",
    "Write a SQL query that returns the ten customers with the highest total order value in 2023, given tables "
    "customers(id, name) and orders(id, customer_id, total, created_at).",
    "Write a bash script that backs up a directory into a dated tar.gz file and keeps only the last seven backups.",
    "Write a JavaScript function that debounces another function, and explain when to use it.",
    "Write a Python class `LRUCache` with get and put in O(1), using only the standard library.",
    "Write a Rust function that counts word frequencies in a string and returns them sorted by count.",
    "Write a Python script that reads a CSV file of sales (date, region, amount) and prints the total per region.",
    "Write a TypeScript interface and a function that validates a user object with name, email and age.",
    "Write a Python function that checks whether a string is a valid IPv4 address, without using regular "
    "expressions.",
    "Write a Go HTTP handler that returns the current server time as JSON.",
    "Write a Python generator that reads a large log file line by line and yields only lines with ERROR.",
]

CODE_EDITS = [
    ("Add type hints and a docstring to this function, changing nothing else:",
     "def average(values):\n    total = 0\n    for v in values:\n        total += v\n    return total / len(values)\n"),
    ("Fix the bug in this code and return the corrected function:",
     "def find_max(items):\n    best = 0\n    for item in items:\n        if item > best:\n            best = item\n"
     "    return best\n"),
    ("Refactor this code to use a dictionary instead of the if chain; keep the behaviour:",
     "def colour_code(name):\n    if name == 'red':\n        return '#ff0000'\n    elif name == 'green':\n"
     "        return '#00ff00'\n    elif name == 'blue':\n        return '#0000ff'\n    elif name == 'black':\n"
     "        return '#000000'\n    else:\n        return None\n"),
    ("Rename the variables in this function to meaningful names and return the whole function:",
     "def f(a, b):\n    c = []\n    for d in a:\n        if d not in b:\n            c.append(d)\n    return c\n"),
    ("Convert this JavaScript to TypeScript with explicit types:",
     "function total(cart) {\n  let sum = 0;\n  for (const item of cart) {\n    sum += item.price * item.qty;\n  }\n"
     "  return Math.round(sum * 100) / 100;\n}\n"),
    ("Add error handling to this Python function so a missing file returns an empty list; return the full code:",
     "def read_lines(path):\n    with open(path) as f:\n        return [line.strip() for line in f]\n"),
]

MATH = [
    "A train leaves at {a}:15 and travels {b} km at {c} km/h. At what time does it arrive? Show your working.",
    "Solve for x: {a}x + {b} = {c}x - {d}. Explain each step.",
    "A shop sells pens at {a} for 3 pounds. How much do {b} pens cost, and how many pens can you buy with {c} "
    "pounds?",
    "What is the probability of rolling a total of {a} with two fair dice? Explain.",
    "A rectangle has a perimeter of {b} cm and one side of {a} cm. What is its area? Show the steps.",
    "Compute the compound interest on {b}00 pounds at {a}% a year for {c} years, and compare it with simple "
    "interest.",
    "Prove that the sum of the first n odd numbers is n squared, and check it for n = {a}.",
    "A recipe for {a} people needs {b}0 g of flour. How much flour is needed for {c} people? Explain.",
    "Find the derivative of f(x) = {a}x^3 - {b}x^2 + {c}x - 7 and the points where the slope is zero.",
]

CHAT = [
    "What are some good ways to stay focused when working from home?",
    "Can you explain the difference between a virus and a bacterium in simple terms?",
    "I'm visiting Lisbon for three days in spring. What should I not miss?",
    "How do I start running if I've never exercised regularly?",
    "What are the pros and cons of electric cars for someone who drives 20 km a day?",
    "Why is the sky blue? Please keep it simple but accurate.",
    "Give me some ideas for a birthday present for my dad, who likes gardening and history.",
    "How can I get better at public speaking?",
    "What's a good way to learn a new language as an adult with a full-time job?",
    "Explain how a mortgage works, including interest and repayment.",
    "I have chicken, rice, peppers and onions. What can I cook tonight?",
    "What should I consider when choosing between two job offers?",
    "Tell me a short story about a lighthouse keeper who finds a message in a bottle.",
    "How does compound interest work, and why does starting early matter?",
    "What are some tips for sleeping better?",
    "Can you help me plan a weekly budget on a 2,000 pound monthly income?",
    "What happened during the French Revolution, in a few paragraphs?",
    "How do I politely decline an invitation to a wedding?",
    "Write a short poem about autumn in the city.",
    "What are good houseplants for a dark flat?",
]


def _messages(rng: random.Random, user: str) -> list[dict[str, str]]:
    system = rng.choice(SYSTEM)
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]


def _tokens(text: str) -> int:
    return max(1, round(len(text) / 4))


def build() -> list[dict]:
    rng = random.Random(2024)
    out: list[dict] = []
    for i, question in enumerate(CHAT):
        for variant in ("", " Please be brief.") if i % 2 == 0 else ("",):
            length = rng.randint(120, 220) if variant else rng.randint(220, 420)
            out.append({"category": "chat", "messages": _messages(rng, question + variant), "max_tokens": length})
    for task in CODE_TASKS:
        out.append({"category": "code", "messages": _messages(rng, task), "max_tokens": rng.randint(250, 550)})
    for (ask, snippet), n in [(e, n) for e in CODE_EDITS for n in range(3)]:
        code = snippet if n == 0 else snippet.replace("    ", "  " if n == 1 else "\t")
        suffix = ["", " Keep the formatting.", " Reply with code only."][n]
        out.append({"category": "code", "messages": _messages(rng, f"{ask}{suffix}\n\n```\n{code}```"),
                    "max_tokens": int(_tokens(code) * 1.3) + 30})
    for passage in PASSAGES:
        for ask, ratio in rng.sample(REWRITE, 4):
            out.append({"category": "rewrite", "messages": _messages(rng, f"{ask}\n\n{passage}"),
                        "max_tokens": max(40, int(_tokens(passage) * ratio) + rng.randint(0, 20))})
        for ask in rng.sample(EXTRACT, 3):
            out.append({"category": "extraction", "messages": _messages(rng, f"{ask}\n\n{passage}"),
                        "max_tokens": rng.randint(60, 160)})
    for template in MATH:
        for _ in range(4):
            a, b, c, d = rng.randint(2, 9), rng.randint(11, 60), rng.randint(2, 12), rng.randint(1, 30)
            out.append({"category": "math", "messages": _messages(rng, template.format(a=a, b=b, c=c, d=d)),
                        "max_tokens": rng.randint(180, 380)})
    seen: set[str] = set()
    unique = []
    for item in out:
        key = json.dumps(item["messages"])
        if key not in seen:
            seen.add(key)
            unique.append(item)
    return unique


def main() -> None:
    items = build()
    OUT.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in items), encoding="utf-8")
    print(f"{OUT}: {len(items)} requests")


if __name__ == "__main__":
    main()
