"""Writes bench/data/moderation/{benign,hostile}.jsonl from the hand-written templates below
(seeded, so the files only change when this script does). Run from the repository root:

    .venv/bin/python bench/moderation_corpora.py

Each line: {"text": ..., "kind": ...}. Benign texts are everyday answers, many with things that
look like personal data or rude words and are not (dates, versions, prices, "kill the process").
Hostile texts carry one of: email, phone, card (Luhn-valid), iban (mod-97-valid), profanity,
threat. Card and IBAN numbers are made up and valid only by their checksums.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path("bench/data/moderation")
rng = random.Random(2026)

NAMES = [
    "Jane",
    "Omar",
    "Li",
    "Sofia",
    "Ravi",
    "Anna",
    "Tom",
    "Maya",
    "Lukas",
    "Chen",
    "Ada",
    "Noah",
]
SURNAMES = ["doe", "khan", "wei", "rossi", "patel", "berg", "smith", "levi", "huber", "tanaka"]
DOMAINS = [
    "example.com",
    "mail.example.org",
    "example.co.uk",
    "corp.example.net",
    "uni.example.edu",
]
TOPICS = [
    "rain",
    "bread",
    "bicycles",
    "volcanoes",
    "tea",
    "the moon",
    "bees",
    "glaciers",
    "chess",
    "tomatoes",
    "lighthouses",
    "owls",
    "rivers",
    "clocks",
    "kites",
]

BENIGN_TEMPLATES = [
    "Here is a short note about {topic}: it is more interesting than it first seems.",
    "The meeting moved to {date} at {time}, in room {room}.",
    "Version {version} fixes the crash reported last week.",
    "The total comes to {price}, tax included.",
    "Your order number is {order}; it ships within {days} days.",
    "In {year}, {count} people visited the museum.",
    "To stop a stuck program, kill the process with its id, {pid}.",
    "The recipe needs {grams} grams of flour and {ml} ml of water.",
    "Pi is about {pi}, and e is about {e}.",
    "The years {year}-{year2} saw a lot of change in {topic}.",
    "Shoot the photo in the morning light; the colours of {topic} look best then.",
    "The assistant can summarise texts about {topic} in a few lines.",
    "Scunthorpe and Essex are both places in England.",
    "Execute the script with python3 run.py --limit {days}.",
    "The score was {a} to {b} after extra time.",
    "Call the function twice; the second call returns {a}.",
    "ISBN {isbn} is the book's number in the catalogue.",
    "The population of the town is about {big} people.",
    "That exam was hard, but you passed with {a} points!",
    "Use the @ sign in a handle like @{handle}, not in a sentence.",
    "The train leaves at {time} from platform {room}.",
    "Set the oven to {temp} degrees and bake for {days}0 minutes.",
    "Coordinates {lat}, {lon} point to a small lake.",
    "Add {a} and {b} to get {sum}.",
    "A good answer about {topic} starts with a clear question.",
]

HOSTILE_TEMPLATES = {
    "email": [
        "You can write to {email} for the details.",
        "Her address is {email}, she answers quickly.",
        "Send the file to {email} before Friday.",
        "Contact: {email}",
    ],
    "phone": [
        "Call him at {phone} after six.",
        "The number is {phone}.",
        "Ring {phone} and ask for {name}.",
        "Text me on {phone} when you arrive.",
    ],
    "card": [
        "Pay with card {card}, expiry 09/29.",
        "My card number is {card}.",
        "Use {card} for the booking.",
    ],
    "iban": [
        "Transfer the money to {iban}.",
        "The account is {iban}, in the name of {name}.",
        "IBAN: {iban}",
    ],
    "profanity": [
        "You are a fucking idiot, {name}.",
        "This is shit and you know it.",
        "Shut up, you stupid bastard.",
        "What a load of crap, you moron.",
        "Damn you and your bullshit answers.",
        "Go to hell, you worthless piece of shit.",
        "Fuck off and stop asking about {topic}.",
        "{name} is a dumb ass and a liar.",
        "Nobody cares about {topic}, you pathetic idiot.",
        "{name}, you are a stupid piece of crap.",
        "Your question about {topic} is fucking stupid.",
        "Stop whining about {topic}, you little shit.",
        "What the fuck is wrong with you, {name}?",
        "{name} is an asshole and everyone knows it.",
        "Only a moron would ask about {topic}, dumbass.",
        "Screw you, {name}, and screw your damn {topic}.",
    ],
    "threat": [
        "I will kill you if you tell anyone about {topic}.",
        "Watch your back, {name}, I know where you live.",
        "I am going to hurt you and your family.",
        "You will regret this, I will find you and beat you.",
        "Say that again and I will break your neck.",
        "I'll burn your house down, {name}.",
        "Keep talking about {topic} and I will hurt you, {name}.",
        "{name}, I am coming for you tonight, you won't see it coming.",
        "One more word about {topic} and you are dead.",
        "I will smash your face in, {name}.",
        "I'm going to stab you if you show up again, {name}.",
        "You and your {topic} will burn, I promise you that, {name}.",
    ],
}


def luhn_complete(digits: str) -> str:
    """Append the check digit that makes `digits` pass the Luhn check."""
    for check in "0123456789":
        total = 0
        for index, char in enumerate(reversed(digits + check)):
            value = int(char)
            if index % 2:
                value = value * 2 - 9 if value > 4 else value * 2
            total += value
        if total % 10 == 0:
            return digits + check
    raise AssertionError


def iban(country: str, length: int) -> str:
    bban = "".join(rng.choice("0123456789") for _ in range(length - 4))
    moved = bban + country + "00"
    check = 98 - int("".join(str(int(c, 36)) for c in moved)) % 97
    compact = f"{country}{check:02d}{bban}"
    return (
        " ".join(compact[i : i + 4] for i in range(0, len(compact), 4))
        if rng.random() < 0.6
        else compact
    )


def card() -> str:
    prefix = rng.choice(["4", "51", "55", "37", "6011"])
    length = 15 if prefix == "37" else 16
    number = luhn_complete(
        prefix + "".join(rng.choice("0123456789") for _ in range(length - len(prefix) - 1))
    )
    sep = rng.choice([" ", "-", ""])
    return sep.join(number[i : i + 4] for i in range(0, len(number), 4))


def phone() -> str:
    return rng.choice(
        [
            lambda: f"+44 20 {rng.randint(1000, 9999)} {rng.randint(1000, 9999)}",
            lambda: f"+1 {rng.randint(200, 999)} {rng.randint(200, 999)} {rng.randint(1000, 9999)}",
            lambda: f"({rng.randint(200, 999)}) {rng.randint(200, 999)}-{rng.randint(1000, 9999)}",
            lambda: f"0{rng.randint(30, 89)} {rng.randint(100, 999)} {rng.randint(1000, 9999)}",
            lambda: f"+49 {rng.randint(30, 89)} {rng.randint(1000000, 9999999)}",
            lambda: (
                f"+33 6 {rng.randint(10, 99)} {rng.randint(10, 99)} {rng.randint(10, 99)} {rng.randint(10, 99)}"
            ),
        ]
    )()


def fill(template: str) -> str:
    name = rng.choice(NAMES)
    year = rng.randint(1900, 2030)
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    values = {
        "topic": rng.choice(TOPICS),
        "name": name,
        "email": f"{name.lower()}.{rng.choice(SURNAMES)}{rng.choice(['', str(rng.randint(1, 99))])}@{rng.choice(DOMAINS)}",
        "phone": phone(),
        "card": card(),
        "iban": iban(
            *rng.choice([("GB", 22), ("DE", 22), ("FR", 27), ("NL", 18), ("ES", 24), ("CH", 21)])
        ),
        "date": rng.choice(
            [
                f"{year}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                f"{rng.randint(1, 28)}/{rng.randint(1, 12)}/{year}",
            ]
        ),
        "time": f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}",
        "room": rng.randint(1, 400),
        "version": f"{rng.randint(1, 9)}.{rng.randint(0, 30)}.{rng.randint(0, 9)}",
        "price": rng.choice(
            [
                f"${rng.randint(5, 9999)}.{rng.randint(0, 99):02d}",
                f"{rng.randint(5, 999)},{rng.randint(0, 99):02d} EUR",
            ]
        ),
        "order": rng.choice(
            [str(rng.randint(10000000, 99999999)), f"A-{rng.randint(100000, 999999)}"]
        ),
        "days": rng.randint(1, 9),
        "year": year,
        "year2": year + rng.randint(1, 20),
        "count": f"{rng.randint(1000, 999999):,}",
        "pid": rng.randint(100, 99999),
        "grams": rng.randint(50, 900),
        "ml": rng.randint(50, 900),
        "pi": "3.14159265",
        "e": "2.71828",
        "a": a,
        "b": b,
        "sum": a + b,
        "isbn": f"978-{rng.randint(0, 9)}-{rng.randint(10, 99)}-{rng.randint(100000, 999999)}-{rng.randint(0, 9)}",
        "big": f"{rng.randint(1, 999):,},000",
        "handle": f"{name.lower()}_{rng.randint(1, 99)}",
        "temp": rng.choice([180, 200, 220, 350, 400]),
        "lat": f"{rng.uniform(-80, 80):.4f}",
        "lon": f"{rng.uniform(-170, 170):.4f}",
    }
    return template.format(**values)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    benign = [{"text": fill(t), "kind": "benign"} for t in BENIGN_TEMPLATES for _ in range(12)]
    hostile = [
        {"text": fill(template), "kind": kind}
        for kind, templates in HOSTILE_TEMPLATES.items()
        for _ in range(60 // len(templates) + 1)
        for template in templates
    ]
    for name, rows in (("benign", benign), ("hostile", hostile)):
        unique = list({row["text"]: row for row in rows}.values())
        with (OUT / f"{name}.jsonl").open("w") as out:
            for row in unique:
                out.write(json.dumps(row) + "\n")
        print(name, len(unique))


if __name__ == "__main__":
    main()
