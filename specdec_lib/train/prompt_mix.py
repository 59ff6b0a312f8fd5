"""Training prompts that look like use: many task families, offline, no new dependencies.

``specdec_lib.models.prompts.stdlib_prompts`` asks six things of standard-library docstrings;
a draft head trained only on those sees one kind of reply.  This module crosses templates with
topic lists written here (questions, explanations, stories, code in seven languages, math word
problems with generated numbers, advice, translation, multi-turn chat) and adds tasks on text
from the Python standard library (docstrings to rewrite or summarise, small function sources
to review or fix).

    items = prompt_mix(2000, seed=0)            # balanced over FAMILIES
    train, heldout = split(items)               # HELDOUT_FAMILIES never in train

Each item is ``{"family": str, "messages": [{"role", "content"}, ...]}``: an optional system
message first, then user / assistant turns alternating, ending on a user turn (the reply to
generate).  Deterministic for a seed.  The template families do not depend on the Python
version (only ``random.Random`` with string / int seeds, stable since 3.2); the stdlib families
(``rewrite``, ``summarise``, ``code_review``) take their text from the running Python's
standard library, so their prompts (and their counts) change with the Python version.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import random
import textwrap
import warnings

from ..models.prompts import clip_paragraphs

__all__ = ["FAMILIES", "HELDOUT_FAMILIES", "prompt_mix", "split", "family_size", "shares"]

# ---------------------------------------------------------------- word lists

_TOPICS = (
    "black holes", "photosynthesis", "the French Revolution", "inflation", "vaccines",
    "plate tectonics", "the printing press", "climate change", "the stock market",
    "machine learning", "the immune system", "volcanoes", "the Roman Empire", "jazz",
    "renewable energy", "sleep", "coffee", "the internet", "bees", "the Moon landing",
    "democracy", "compound interest", "tides", "the water cycle", "antibiotics", "chess",
    "the Silk Road", "electric cars", "DNA", "rainbows", "earthquakes", "the human brain",
    "supply and demand", "the Renaissance", "quantum computing", "coral reefs", "glaciers",
    "the Olympic Games", "social media", "public libraries", "the violin", "bread baking",
    "urban gardening", "recycling", "the Industrial Revolution", "migratory birds",
    "solar panels", "minimalism", "remote work", "the Great Wall of China", "hurricanes",
    "meditation", "credit scores", "open-source software", "the theory of evolution",
    "mushrooms", "the periodic table", "stars", "ancient Egypt", "cryptocurrency",
    "the Amazon rainforest", "marathon running", "video games", "the metric system",
    "tea", "origami", "trains", "the ocean floor", "language learning", "architecture",
    "friendship", "time zones", "wolves", "the Cold War", "nuclear power", "poetry",
    "gravity", "the human heart", "deserts", "cheese making",
)

_CONCEPTS = (
    "recursion", "a hash table", "entropy", "opportunity cost", "natural selection",
    "the Pythagorean theorem", "a mortgage", "osmosis", "a neural network", "encryption",
    "a binary search", "photosynthesis", "inflation", "the greenhouse effect", "a vaccine",
    "an index fund", "a compiler", "the placebo effect", "relativity", "a blockchain",
    "supply chains", "a derivative in calculus", "probability", "a recession",
    "the scientific method", "an API", "a database transaction", "garbage collection",
    "a virus", "the speed of light", "interest rates", "a metaphor", "irony", "the Big Bang",
    "caching", "a linked list", "gradient descent", "a tax deduction", "an election system",
    "the food chain", "continental drift", "a sonnet", "a fugue", "compound interest",
    "statistical significance", "a firewall", "DNS", "a load balancer", "version control",
    "an operating system", "a prime number", "the central limit theorem", "exponential growth",
    "a mutex", "latency and bandwidth", "a budget", "carbon dating", "a lunar eclipse",
    "the stock exchange", "a contract",
)

_AUDIENCES = ("", " to a ten-year-old", " to a complete beginner", " to a university student",
              " to an expert, briefly", " using an everyday analogy", " in one paragraph")

_QUESTION_TEMPLATES = (
    "What is the most interesting thing about {t}?",
    "Why does {t} matter today?",
    "What are common misconceptions about {t}?",
    "How did {t} change the world?",
    "What should everyone know about {t}?",
    "Can you tell me about {t}?",
    "What are the pros and cons of {t}?",
    "How would you explain the history of {t}?",
    "What questions are scientists still asking about {t}?",
    "Give me three surprising facts about {t}.",
    "What is the future of {t}?",
    "How is {t} connected to everyday life?",
    "What would happen if {t} disappeared?",
    "Who are the key people associated with {t}?",
    "Is {t} overrated? Give a balanced answer.",
    "What is a good first book or resource about {t}?",
    "How do {t} and {u} compare?",
    "What do {t} and {u} have in common?",
)

_EXPLAIN_TEMPLATES = (
    "Explain {c}{a}.",
    "What is {c}? Explain it{a}.",
    "How does {c} work? Explain{a}.",
    "I never understood {c}. Can you explain it{a}?",
    "Describe {c}{a}, with one example.",
    "Explain the difference between {c} and {d}{a}.",
    "Why is {c} useful? Answer{a}.",
    "Walk me through {c} step by step{a}.",
)

_FORMS = ("a short story", "a poem", "a haiku", "a limerick", "a fable", "a diary entry",
          "a letter", "a dialogue", "the opening paragraph of a novel", "a song chorus",
          "a short scene for a play", "a bedtime story", "a product description",
          "a speech", "a myth")
_SUBJECTS = ("a lighthouse keeper", "a lost robot", "a dragon who is afraid of fire",
             "the last tree in a city", "a cat who runs a bakery", "two rival chess players",
             "a time traveller stuck in 1850", "a detective who cannot smell", "a forgotten moon",
             "an old violin", "a girl who collects clouds", "a village with no clocks",
             "an astronaut's first day on Mars", "a talking river", "a grandmother's recipe",
             "a ship made of glass", "the first day of winter", "a shy ghost",
             "a bicycle that wants to fly", "a library at midnight", "a tiny island kingdom",
             "a retired superhero", "a thunderstorm over the sea", "a map with a missing city",
             "a chef who has lost their taste", "an inventor's failed machine",
             "a friendship between a fox and a crow", "a train that never stops",
             "a garden on a rooftop", "the end of summer", "a mountain that moves",
             "a letter that arrives fifty years late")
_STYLES = ("", " in a funny tone", " in a melancholy tone", " for children",
           " with a twist ending", " in the style of a fairy tale", " in under 150 words",
           " told in the first person", " set in the far future")
_CREATIVE_TEMPLATES = ("Write {f} about {s}{st}.", "Compose {f} about {s}{st}.",
                       "Could you write {f} about {s}{st}?")

_LANGS = ("Python", "JavaScript", "SQL", "bash", "C", "Rust", "Go")
_CODE_TASKS = (
    "reverses a string", "checks whether a number is prime", "computes the nth Fibonacci number",
    "counts the words in a text", "removes duplicates from a list while keeping the order",
    "finds the largest element of an array", "checks whether a string is a palindrome",
    "merges two sorted lists", "converts Celsius to Fahrenheit", "computes a factorial",
    "sorts a list of records by a field", "parses a CSV line into fields",
    "computes the average of a list of numbers", "finds the most common element",
    "flattens a nested list", "validates an email address roughly",
    "computes the greatest common divisor of two numbers", "generates a random password",
    "reads a file and prints lines that contain a word", "counts vowels in a string",
    "implements binary search", "rotates an array by k positions",
    "checks whether two strings are anagrams", "converts a number to binary",
    "computes the sum of the digits of a number", "implements a simple stack",
    "finds the second largest number", "capitalises every word in a sentence",
    "computes the median of a list", "implements FizzBuzz up to 100",
    "counts how often each character appears", "checks whether brackets are balanced",
    "computes the dot product of two vectors", "transposes a matrix",
    "converts a Roman numeral to an integer", "finds all pairs that sum to a target",
    "implements bubble sort", "computes compound interest", "formats a duration in seconds",
    "truncates a string to a maximum length with an ellipsis",
)
_SQL_TASKS = (
    "the ten customers with the highest total order value", "the number of orders per month",
    "employees who earn more than their manager", "products that were never ordered",
    "the average salary per department", "duplicate email addresses in a users table",
    "the second highest salary", "customers who ordered in every month of 2023",
    "the running total of sales by day", "the most popular product in each category",
    "users who signed up but never logged in", "the top three scores per game",
    "orders placed on weekends", "departments with more than ten employees",
    "the percentage of orders that were returned", "the median order value",
    "authors with more than five books", "the longest streak of consecutive login days",
    "the month-over-month revenue growth", "rows that changed between two snapshot tables",
)
_BASH_TASKS = (
    "finds the ten largest files in a directory tree", "renames all .jpeg files to .jpg",
    "counts lines of code per file extension", "backs up a directory into a dated tar.gz",
    "prints the most frequent IP addresses in an access log",
    "deletes files older than thirty days", "checks whether a website responds",
    "watches a directory and prints new files", "replaces a word in every text file",
    "prints disk usage of each subdirectory sorted by size",
    "retries a command up to five times", "splits a large file into chunks",
    "prints the lines two files have in common", "converts tabs to spaces in all files",
    "shows the processes that use the most memory",
)
_CODE_TEMPLATES = (
    "Write a {L} function that {t}.",
    "Show me how to write {L} code that {t}.",
    "In {L}, how do I write a function that {t}?",
    "Implement a {L} function that {t}. Add comments.",
    "Write a {L} function that {t}, and a few tests for it.",
    "Write an efficient {L} function that {t} and explain its complexity.",
)
_SQL_TEMPLATES = ("Write a SQL query that finds {t}.", "How would I get {t} in SQL?",
                  "Write a PostgreSQL query for {t}, and explain it.",
                  "Give me a SQL query listing {t}. Assume reasonable table names.")
_BASH_TEMPLATES = ("Write a bash script that {t}.", "How do I write a shell one-liner that {t}?",
                   "Write a portable POSIX shell script that {t}, with error handling.")

_ITEMS = ("apples", "pencils", "books", "marbles", "stickers", "cookies", "tickets", "shirts",
          "bottles of water", "notebooks", "plants", "boxes")
_NAMES = ("Alice", "Ben", "Chen", "Dara", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jonas",
          "Kofi", "Lena", "Mateo", "Nora", "Omar", "Priya")

_ADVICE_TEMPLATES = (
    "Give me {k} tips for {s}.", "What are {k} common mistakes people make when {g}?",
    "List {k} ideas for {s}.", "I'm {g}. What should I keep in mind? Give {k} points.",
    "Make a checklist of {k} things for {s}.", "What are {k} good habits for {s}?",
)
_SITUATIONS = (
    ("a job interview", "preparing for a job interview"),
    ("learning a new language", "learning a new language"),
    ("saving money", "trying to save money"),
    ("a first marathon", "training for a first marathon"),
    ("moving to a new city", "moving to a new city"),
    ("working from home", "working from home"),
    ("a small vegetable garden", "starting a vegetable garden"),
    ("better sleep", "trying to sleep better"),
    ("public speaking", "giving a talk in public"),
    ("a family road trip", "planning a family road trip"),
    ("a birthday party for a child", "organising a child's birthday party"),
    ("studying for exams", "studying for exams"),
    ("a healthy breakfast", "trying to eat a healthier breakfast"),
    ("a code review", "reviewing a colleague's code"),
    ("writing a CV", "writing a CV"),
    ("keeping houseplants alive", "caring for houseplants"),
    ("a rainy weekend", "stuck at home on a rainy weekend"),
    ("a team meeting", "running a team meeting"),
    ("reducing screen time", "trying to reduce screen time"),
    ("adopting a dog", "adopting a dog"),
    ("a first apartment", "renting a first apartment"),
    ("negotiating a salary", "negotiating a salary"),
    ("learning to cook", "learning to cook"),
    ("a camping trip", "going camping for the first time"),
    ("writing a novel", "writing a first novel"),
    ("staying focused", "trying to stay focused at work"),
    ("making friends as an adult", "trying to make friends as an adult"),
    ("a wedding speech", "writing a wedding speech"),
    ("learning the guitar", "learning the guitar"),
    ("a zero-waste kitchen", "trying to reduce kitchen waste"),
)
_COUNTS = ("three", "five", "seven", "ten")

_SENT_SUBJ = ("My brother", "The teacher", "Our neighbour", "The little girl", "My friend",
              "The old man", "The doctor", "Everyone in the office", "The cat", "We")
_SENT_PRED = ("is reading a book in the garden", "will arrive tomorrow morning",
              "forgot the keys at home", "likes to cook on Sundays",
              "is looking for the train station", "bought fresh bread this morning",
              "has never seen the sea", "wants to learn to swim", "lost the umbrella again",
              "is waiting for the bus", "works in a small hospital", "sings in a choir",
              "visited the museum last week", "cannot find the way to the hotel",
              "drinks tea without sugar", "is afraid of the dark")
_TARGET_LANGS = ("French", "Spanish", "German", "Italian", "Portuguese", "Dutch", "Japanese",
                 "Chinese", "Russian", "Polish", "Turkish", "Swedish")
_TRANSLATE_TEMPLATES = ('Translate into {lang}: "{s}"', "How do you say this in {lang}? {s}",
                        "Translate this sentence to {lang} and explain the grammar:\n\n{s}")

_SYSTEMS = (
    "You are a helpful assistant.", "You are a friendly tutor who explains things simply.",
    "You are a concise assistant. Keep answers short.",
    "You are an experienced software engineer helping a colleague.",
    "You are a patient teacher for high-school students.",
    "You are a travel guide with a good sense of humour.",
    "You are a careful assistant who says when it is unsure.", None,
)
_FOLLOWUPS = ("Can you give me a concrete example?", "Can you make that shorter?",
              "Why is that?", "What is the most important part of that?",
              "Could you explain the second point in more detail?",
              "How would I explain that to a child?", "What is a common mistake here?",
              "Thanks! Can you summarise it in one sentence?",
              "Is there anything that contradicts this?", "Where can I learn more?")
_OPENERS = ("Sure. In short, {t} is a big subject; the key ideas are its origins, how it works, "
            "and why it matters. Which part interests you most?",
            "Good question. {T} touches many areas. I'd start with the basics and then look at "
            "one example.",
            "Here is a brief overview of {t}: it has a long history, a few central ideas, and "
            "some open questions.")

_REWRITE_TEMPLATES = (
    "Rewrite the following text in plain English for a beginner:\n\n{doc}",
    "Rewrite this documentation as a short bulleted list.\n\n{doc}",
    "Make this text more formal and clear:\n\n{doc}",
    "Rewrite this as a friendly paragraph for a blog post:\n\n{doc}",
    "Turn this text into three questions and answers:\n\n{doc}",
)
_SUMMARY_TEMPLATES = (
    "Summarise the following text in two sentences.\n\n{doc}",
    "What are the main points of this text?\n\n{doc}",
    "Give a one-line summary of this documentation:\n\n{doc}",
    "TL;DR of the following, please:\n\n{doc}",
    "Explain in simple words what `{name}` does.\n\n{doc}",
)
_REVIEW_TEMPLATES = (
    "Review this Python function. Point out bugs, edge cases and style problems:\n\n"
    "```python\n{src}```",
    "Can you suggest improvements to this code?\n\n```python\n{src}```",
    "Explain what this function does, line by line:\n\n```python\n{src}```",
    "Add type hints and a docstring to this function:\n\n```python\n{src}```",
    "Write unit tests for this function:\n\n```python\n{src}```",
    "This function has a bug: {bug}. Find it and fix it.\n\n```python\n{src}```",
)
_BUGS = (("return ", "return not ", "it returns the wrong truth value"),
         (" + 1", " - 1", "an off-by-one error"),
         (" < ", " <= ", "a wrong comparison at a boundary"),
         (" == ", " != ", "an inverted test"))

# pure-Python modules whose docstrings and small functions the stdlib families use
_STDLIB_MODULES = (
    "argparse", "base64", "bisect", "calendar", "collections", "colorsys", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "difflib", "email.utils",
    "enum", "fileinput", "fnmatch", "fractions", "ftplib", "functools", "getopt", "gettext",
    "glob", "gzip", "heapq", "hmac", "html", "http.cookies", "imaplib", "inspect",
    "ipaddress", "json", "json.decoder", "logging", "mailbox", "mimetypes", "netrc",
    "numbers", "operator", "optparse", "os", "pathlib", "pickle", "platform", "plistlib",
    "posixpath", "pprint", "queue", "quopri", "random", "reprlib", "sched", "secrets",
    "selectors", "shlex", "shutil", "smtplib", "socket", "statistics", "string",
    "subprocess", "sysconfig", "tarfile", "tempfile", "textwrap", "threading", "timeit",
    "tokenize", "trace", "traceback", "types", "typing", "urllib.parse", "urllib.request",
    "uuid", "warnings", "wave", "weakref", "zipfile", "zipimport",
)


@functools.lru_cache(maxsize=None)
def _stdlib_text():
    with warnings.catch_warnings():     # typing.re and friends warn when looked at
        warnings.simplefilter("ignore")
        return _collect_stdlib_text()


def _collect_stdlib_text():
    """(docstrings, sources): ``(name, doc)`` with doc >= 120 characters, and ``(name, src)``
    of module-level Python functions of 4..25 lines; sorted, duplicates dropped.  Depends on
    the running Python's standard library."""
    docs, srcs, seen_d, seen_s = [], [], set(), set()
    for mod_name in _STDLIB_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except Exception:      # noqa: BLE001 - not on this platform: not in the set
            continue
        members = [(mod_name, mod)]
        for attr in sorted(vars(mod)):
            obj = vars(mod)[attr]
            if attr.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
                continue
            if inspect.isfunction(obj) or inspect.isclass(obj):
                members.append((f"{mod_name}.{attr}", obj))
            if inspect.isclass(obj):
                for meth in sorted(vars(obj)):
                    f = vars(obj)[meth]
                    if not meth.startswith("_") and inspect.isfunction(f):
                        members.append((f"{mod_name}.{attr}.{meth}", f))
        for name, obj in members:
            doc = clip_paragraphs(inspect.getdoc(obj) or "", 700)
            if len(doc) >= 120 and doc not in seen_d:
                seen_d.add(doc)
                docs.append((name, doc))
            if inspect.isfunction(obj):
                try:
                    src = textwrap.dedent(inspect.getsource(obj))
                except (OSError, TypeError):
                    continue
                if 4 <= src.count("\n") <= 25 and src not in seen_s:
                    seen_s.add(src)
                    srcs.append((name, src))
    return tuple(docs), tuple(srcs)


# ---------------------------------------------------------------- families
# Each family is (size, build): build(i) -> messages for index i in range(size), a pure
# function of i (mixed-radix over the lists above; generated numbers from Random(f"{fam}:{i}")).

def _radix(i, *sizes):
    out = []
    for s in sizes:
        i, r = divmod(i, s)
        out.append(r)
    return out


def _user(text, system=None):
    msgs = [{"role": "system", "content": system}] if system else []
    return msgs + [{"role": "user", "content": text}]


def _one_or_two(templates, slot):
    """(templates without ``slot``, templates with it)."""
    return (tuple(t for t in templates if slot not in t), tuple(t for t in templates if slot in t))


_Q1, _Q2 = _one_or_two(_QUESTION_TEMPLATES, "{u}")
_E1, _E2 = _one_or_two(_EXPLAIN_TEMPLATES, "{d}")
_N_Q1 = len(_Q1) * len(_TOPICS)
_N_E1 = len(_E1) * len(_CONCEPTS) * len(_AUDIENCES)


def _question(i):
    if i < _N_Q1:
        q, t = _radix(i, len(_Q1), len(_TOPICS))
        return _user(_Q1[q].format(t=_TOPICS[t]))
    q, t, u = _radix(i - _N_Q1, len(_Q2), len(_TOPICS), len(_TOPICS) - 1)
    u = u + (u >= t)       # another topic
    return _user(_Q2[q].format(t=_TOPICS[t], u=_TOPICS[u]))


def _explain(i):
    if i < _N_E1:
        e, c, a = _radix(i, len(_E1), len(_CONCEPTS), len(_AUDIENCES))
        return _user(_E1[e].format(c=_CONCEPTS[c], a=_AUDIENCES[a]))
    e, c, a, d = _radix(i - _N_E1, len(_E2), len(_CONCEPTS), len(_AUDIENCES), len(_CONCEPTS) - 1)
    d = d + (d >= c)
    return _user(_E2[e].format(c=_CONCEPTS[c], a=_AUDIENCES[a], d=_CONCEPTS[d]))


def _creative(i):
    k, f, s, st = _radix(i, len(_CREATIVE_TEMPLATES), len(_FORMS), len(_SUBJECTS), len(_STYLES))
    return _user(_CREATIVE_TEMPLATES[k].format(f=_FORMS[f], s=_SUBJECTS[s], st=_STYLES[st]))


_GEN_LANGS = tuple(lang for lang in _LANGS if lang not in ("SQL", "bash"))
_N_SQL = len(_SQL_TEMPLATES) * len(_SQL_TASKS)


def _code_family(langs, tasks):
    """(size, build) of the code prompts: functions in ``langs`` for ``tasks``, then the SQL
    and bash ones."""
    n_gen = len(_CODE_TEMPLATES) * len(langs) * len(tasks)

    def build(i):
        if i < n_gen:
            k, L, t = _radix(i, len(_CODE_TEMPLATES), len(langs), len(tasks))
            return _user(_CODE_TEMPLATES[k].format(L=langs[L], t=tasks[t]))
        i -= n_gen
        if i < _N_SQL:
            k, t = _radix(i, len(_SQL_TEMPLATES), len(_SQL_TASKS))
            return _user(_SQL_TEMPLATES[k].format(t=_SQL_TASKS[t]))
        k, t = _radix(i - _N_SQL, len(_BASH_TEMPLATES), len(_BASH_TASKS))
        return _user(_BASH_TEMPLATES[k].format(t=_BASH_TASKS[t]))
    return (lambda: n_gen + _N_SQL + len(_BASH_TEMPLATES) * len(_BASH_TASKS)), build


def _math(i):
    r = random.Random(f"math:{i}")
    a, b, c = 2 + (i // 8) % 97, r.randint(2, 30), r.randint(2, 9)
    n1, n2 = r.sample(_NAMES, 2)
    item = r.choice(_ITEMS)
    price = r.randint(105, 2999) / 100
    pct = r.choice((5, 10, 15, 20, 25, 30, 40))
    speed, hours = r.randint(30, 120), r.randint(2, 9)
    kind = i % 8
    if kind == 0:
        q = f"{n1} has {a} {item}. {n2} gives {n1} {b} more, then {n1} shares them equally " \
            f"among {c} friends. How many does each friend get, and how many are left over?"
    elif kind == 1:
        q = f"One of the {item} costs ${price:.2f}. How much do {b} of them cost after a " \
            f"{pct}% discount?"
    elif kind == 2:
        q = f"A train travels at {speed} km/h for {hours} hours, then at {speed // 2 + 10} km/h " \
            f"for {c} more hours. How far does it travel in total, and what is its average speed?"
    elif kind == 3:
        q = f"A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter? " \
            f"If both sides grow by {c} cm, by how much does the area grow?"
    elif kind == 4:
        q = f"{n1} saves ${a * 10} a month. With {pct // 5}% yearly interest, compounded " \
            f"yearly, how much will {n1} have after {c} years? Show your steps."
    elif kind == 5:
        q = f"{n1} can paint a fence in {c + 1} hours and {n2} can paint it in {c + b} hours. " \
            f"How long does it take them working together?"
    elif kind == 6:
        q = f"The average of {c} numbers is {a}. When one more number is added the average " \
            f"becomes {a + 1}. What is the added number?"
    else:
        q = f"A bag holds {a} red and {b} blue marbles. If you draw {min(c, 3)} marbles without " \
            f"replacement, what is the probability that all are red?"
    return _user(q + r.choice(("", " Explain your reasoning.", " Think step by step.",
                                " Give the final answer on its own line.")))


def _advice_family(templates, situations, counts=_COUNTS):
    """(size, build) of the advice prompts over these templates, situations and counts."""
    def build(i):
        k, s, c = _radix(i, len(templates), len(situations), len(counts))
        s_noun, s_ger = situations[s]
        return _user(templates[k].format(k=counts[c], s=s_noun, g=s_ger))
    return (lambda: len(templates) * len(situations) * len(counts)), build


def _translation(i):
    k, lang, s, p = _radix(i, len(_TRANSLATE_TEMPLATES), len(_TARGET_LANGS), len(_SENT_SUBJ),
                           len(_SENT_PRED))
    subj, pred = _SENT_SUBJ[s], _SENT_PRED[p]
    if subj == "We":
        pred = pred.replace("is ", "are ", 1).replace("has ", "have ", 1)
        pred = pred.replace("likes", "like").replace("wants", "want").replace("works", "work")
        pred = pred.replace("sings", "sing").replace("drinks", "drink")
    return _user(_TRANSLATE_TEMPLATES[k].format(lang=_TARGET_LANGS[lang], s=f"{subj} {pred}."))


_N_CHAT_SHORT = len(_SYSTEMS) * len(_TOPICS) * len(_OPENERS) * len(_FOLLOWUPS)


def _chat(i):
    long_ = i >= _N_CHAT_SHORT            # the first ones two user turns, the rest three
    s, t, o, f1, f2 = _radix(i - _N_CHAT_SHORT if long_ else i, len(_SYSTEMS), len(_TOPICS),
                             len(_OPENERS), len(_FOLLOWUPS), len(_FOLLOWUPS) - 1)
    f2 = f2 + (f2 >= f1)
    topic = _TOPICS[t]
    msgs = _user(_QUESTION_TEMPLATES[(t + s) % 6].format(t=topic, u=""), _SYSTEMS[s])
    msgs.append({"role": "assistant",
                 "content": _OPENERS[o].format(t=topic, T=topic[0].upper() + topic[1:])})
    msgs.append({"role": "user", "content": _FOLLOWUPS[f1]})
    if long_:
        msgs.append({"role": "assistant", "content": f"Of course. Take {topic}: the short "
                     "answer depends on the details, but the main idea is simple."})
        msgs.append({"role": "user", "content": _FOLLOWUPS[f2]})
    return msgs


def _doc_family(templates):
    def size():
        return len(_stdlib_text()[0]) * len(templates)

    def build(i):
        k, d = _radix(i, len(templates), len(_stdlib_text()[0]))
        name, doc = _stdlib_text()[0][d]
        return _user(templates[k].format(name=name, doc=doc))
    return size, build


def _review_size():
    return len(_stdlib_text()[1]) * len(_REVIEW_TEMPLATES)


def _review(i):
    k, d = _radix(i, len(_REVIEW_TEMPLATES), len(_stdlib_text()[1]))
    name, src = _stdlib_text()[1][d]
    bug = ""
    if "{bug}" in _REVIEW_TEMPLATES[k]:
        for old, new, what in _BUGS:          # plant the first bug that applies
            if old in src:
                src, bug = src.replace(old, new, 1), what
                break
        else:              # nothing to plant: ask about a bug that may not be there
            return _user("Is there a bug in this function? If so, fix it; if not, say why "
                         f"it is correct.\n\n```python\n{src}```")
    return _user(_REVIEW_TEMPLATES[k].format(src=src, bug=bug))


_FAMILY_TABLE = {
    "question": (lambda: _N_Q1 + len(_Q2) * len(_TOPICS) * (len(_TOPICS) - 1), _question),
    "explain": (lambda: _N_E1 + len(_E2) * len(_CONCEPTS) * len(_AUDIENCES)
                * (len(_CONCEPTS) - 1), _explain),
    "creative": (lambda: len(_CREATIVE_TEMPLATES) * len(_FORMS) * len(_SUBJECTS) * len(_STYLES),
                 _creative),
    "code": _code_family(_GEN_LANGS, _CODE_TASKS),
    "code_review": (_review_size, _review),
    "math": (lambda: 8 * 97 * 20, _math),     # generated numbers: ~1-2% repeat
    "advice": _advice_family(_ADVICE_TEMPLATES, _SITUATIONS),
    "rewrite": _doc_family(_REWRITE_TEMPLATES),
    "summarise": _doc_family(_SUMMARY_TEMPLATES),
    "translation": (lambda: len(_TRANSLATE_TEMPLATES) * len(_TARGET_LANGS) * len(_SENT_SUBJ)
                    * len(_SENT_PRED), _translation),
    "chat": (lambda: _N_CHAT_SHORT * len(_FOLLOWUPS), _chat),
}

# Version 2 of the mix (``--prompts-from mix2``, s27): the two families that training used up
# (advice 720 prompts, code 1,325, against 3.5k-28k for the others; s25's 30k draw took every
# one, so the e2e "general" set had none of either left) grown: more situations, advice
# templates and counts, more languages and tasks (a 30k draw leaves ~1.7k of each unused).
# Every other family is version 1's, prompt for prompt, and version 1 stays as it was (the
# shipped heads' recorded commands reproduce their data).
_ADVICE_TEMPLATES_V2 = _ADVICE_TEMPLATES + (
    "How do I get better at {s}? Give {k} concrete steps.",
    "My friend is {g}. What {k} pieces of advice would you give them?",
    "What should I avoid when {g}? List {k} things.",
    "I want help with {s}. Give me {k} suggestions.",
)
_SITUATIONS_V2 = _SITUATIONS + (
    ("a long flight", "flying long-haul"), ("a job change", "changing careers at forty"),
    ("learning to code", "learning to program"), ("a tidy home", "decluttering a home"),
    ("a new baby", "preparing for a new baby"), ("running a book club", "running a book club"),
    ("a small business", "starting a small business"), ("a budget", "making a monthly budget"),
    ("a difficult conversation", "having a difficult conversation with a colleague"),
    ("a hiking trip", "planning a day hike"), ("learning to draw", "learning to draw"),
    ("a remote team", "managing a remote team"), ("retirement", "planning for retirement"),
    ("a dinner party", "hosting a dinner party"), ("a home office", "setting up a home office"),
    ("a language exchange", "practising a language with a partner"),
    ("a gym routine", "starting to go to the gym"), ("a lost wallet", "dealing with a lost wallet"),
    ("a first date", "going on a first date"), ("a school project", "helping a child with a school project"),
    ("a job rejection", "coping with a job rejection"), ("a garage sale", "organising a garage sale"),
    ("an online course", "taking an online course"), ("a volunteer project", "volunteering locally"),
    ("a new manager role", "becoming a manager for the first time"),
    ("a cycling commute", "cycling to work"), ("a noisy neighbour", "dealing with a noisy neighbour"),
    ("a photography hobby", "taking better photos with a phone"),
    ("a meditation habit", "starting to meditate"), ("a science fair", "preparing for a science fair"),
    ("an open-source contribution", "contributing to an open-source project"),
    ("a trip abroad", "travelling abroad for the first time"), ("a pet cat", "adopting a cat"),
    ("a podcast", "starting a podcast"), ("a kitchen garden", "growing herbs on a windowsill"),
    ("a marathon recovery", "recovering after a marathon"), ("a tax return", "filing a tax return"),
    ("a house move with kids", "moving house with small children"),
    ("a presentation", "preparing slides for a presentation"), ("a chess habit", "getting better at chess"),
)
_COUNTS_V2 = _COUNTS + ("four", "six", "eight")
_LANGS_V2 = _GEN_LANGS + ("TypeScript", "Java", "C++", "C#", "Ruby", "Kotlin")
_CODE_TASKS_V2 = _CODE_TASKS + (
    "checks whether a year is a leap year", "converts a string to title case",
    "finds the intersection of two lists", "counts the lines of a file",
    "implements a queue with two stacks", "returns the n most frequent words of a text",
    "checks whether a number is a perfect square", "computes the Levenshtein distance",
    "groups a list of words by their first letter", "removes the whitespace from a string",
    "computes the number of days between two dates", "finds the longest word in a sentence",
    "implements insertion sort", "converts a dictionary to a JSON string",
    "checks whether a list is sorted", "computes the area of a circle from its radius",
    "splits a list into chunks of size n", "finds the missing number in 1..n",
    "implements a linked list with insert and delete", "computes the power set of a set",
    "converts hours and minutes to minutes", "finds the first non-repeating character",
    "validates a phone number", "computes the running total of a list",
    "implements a simple calculator for + - * /", "shuffles a list in place",
    "counts the occurrences of a substring", "checks whether a string has unique characters",
    "merges two dictionaries", "reverses the words of a sentence",
)
_FAMILY_TABLE_V2 = dict(_FAMILY_TABLE, code=_code_family(_LANGS_V2, _CODE_TASKS_V2),
                        advice=_advice_family(_ADVICE_TEMPLATES_V2, _SITUATIONS_V2, _COUNTS_V2))
MIX_VERSIONS = {1: _FAMILY_TABLE, 2: _FAMILY_TABLE_V2}

FAMILIES = tuple(_FAMILY_TABLE)
HELDOUT_FAMILIES = ("translation", "chat")


def _table(version):
    if version not in MIX_VERSIONS:
        raise ValueError(f"version: {version!r}; the mix has versions {sorted(MIX_VERSIONS)}")
    return MIX_VERSIONS[version]


def family_size(family: str, version: int = 1) -> int:
    """How many prompts ``family`` has in that version of the mix (the stdlib families: for
    this Python)."""
    return _table(version)[family][0]()


def shares(n, sizes):
    """``n`` split evenly over the keys of ``sizes`` ({name: how many it has}, in order; the
    first ones get the remainder); what a small one cannot give goes to the others."""
    want, left, open_ = {f: 0 for f in sizes}, n, list(sizes)
    while left and open_:
        share, extra = divmod(left, len(open_))
        for j, f in enumerate(open_):
            want[f] += share + (j < extra)
        left = 0
        for f in open_:
            if want[f] > sizes[f]:
                left += want[f] - sizes[f]
                want[f] = sizes[f]
        open_ = [f for f in open_ if want[f] < sizes[f]]
    return want


def prompt_mix(n=None, *, seed=0, families=None, version=1):
    """``n`` prompts spread evenly over ``families`` (default all of FAMILIES), each family's
    share drawn without repetition from its prompts in a ``seed``-shuffled order (a family
    smaller than its share gives all it has); the families interleaved round-robin.
    ``n=None``: every prompt of those families (large: the template families alone have
    hundreds of thousands). ``version``: which mix (``MIX_VERSIONS``; 2 grows advice and code)."""
    table = _table(version)
    fams = FAMILIES if families is None else tuple(families)
    unknown = [f for f in fams if f not in table]
    if unknown:
        raise ValueError(f"unknown families {unknown}; known: {FAMILIES}")
    if n is not None and n < 0:
        raise ValueError(f"n must be >= 0, not {n}")
    sizes = {f: family_size(f, version) for f in fams}
    want = dict(sizes) if n is None else shares(n, sizes)
    picks = {}
    for f in fams:
        r = random.Random(f"{seed}:{f}")
        k = want[f]
        picks[f] = r.sample(range(sizes[f]), k) if k < sizes[f] else list(range(sizes[f]))
        if k == sizes[f]:
            r.shuffle(picks[f])
    out, build = [], {f: table[f][1] for f in fams}
    for j in range(max(want.values(), default=0)):
        for f in fams:
            if j < want[f]:
                out.append({"family": f, "messages": build[f](picks[f][j])})
    return out


def split(items):
    """(train, heldout): the items of HELDOUT_FAMILIES go to heldout, the rest to train."""
    train = [it for it in items if it["family"] not in HELDOUT_FAMILIES]
    held = [it for it in items if it["family"] in HELDOUT_FAMILIES]
    return train, held
