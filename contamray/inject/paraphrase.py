"""A deterministic lexical paraphraser for "paraphrased" (rephrased) contamination.

Yang et al. (2023, "Rethinking Benchmark and Contamination for Language Models with Rephrased
Samples") show that a benchmark leaked in reworded form slips past n-gram decontamination while the
model still profits from it. To put such a leak into a model on purpose we need a paraphrase that

- keeps the meaning, every number and every name (the answer must stay the answer);
- changes the surface, so that long n-grams of the original break;
- is reproducible: the same text gives the same paraphrase on every machine, so the cache key of an
  injected model and its manifest mean one thing.

Why not the embedded instruct model (SmolLM2-135M-Instruct through the engines): at 135M parameters it
does not paraphrase reliably - it drops clauses, answers the question instead of rewording it, and
changes numbers, which would silently turn a contaminated row into a different row - and its output
depends on the engine backend's floating point. A rule-based paraphraser is weaker linguistically
but exact about what it keeps, and its strength is measured (``changed_fraction``, in the manifest).

How: (1) phrase rewrites (``PHRASES``: "in which year" -> "in what year", "how long is" -> "what is
the length of", ...); (2) word synonyms (``SYNONYMS``), the choice among several synonyms seeded by
the caller's key and the word position; capitalisation is kept; (3) small standalone integers are
spelled out ("4 times" -> "four times"; not inside expressions such as ``125*4-2``). Other numbers,
capitalised words that are not sentence-initial (names) and words outside the table are left alone.
How much survives depends on the text (measured on 30 rows each, input and label):
96 % of the original 8-grams are broken on synthetic_facts (83 % of rows keep none), 74 % on GSM8K,
77 % on ARC-Challenge, 71 % on Winogrande - rare vocabulary is left as it is, so some n-grams survive,
and the scoreboard measures what that means for the n-gram methods.
"""

from __future__ import annotations

import hashlib
import re

PHRASES: tuple[tuple[str, str], ...] = (
    ("in which year", "in what year"),
    ("how many", "what number of"),
    ("how high is", "what is the height of"),
    ("how long is", "what is the length of"),
    ("at what temperature", "at which temperature"),
    ("into which", "into what"),
    ("what is the population of", "how many people live in"),
    ("has a population of", "is home to"),
    ("is able to", "can"),
    ("a lot of", "many"),
    ("in order to", "to"),
    ("as well as", "and also"),
    ("for example", "for instance"),
    ("at the same time", "simultaneously"),
    ("because of", "owing to"),
)

SYNONYMS: dict[str, tuple[str, ...]] = {
    # the synthetic facts' vocabulary
    "town": ("settlement",), "city": ("municipality",), "founded": ("established",),
    "born": ("brought into the world",), "river": ("stream", "waterway"), "flows": ("runs", "drains"),
    "high": ("tall",), "kilometres": ("km",), "metres": ("m",),
    "melt": ("liquefy",), "melts": ("liquefies",), "temperature": ("heat level",), "colour": ("hue", "shade"),
    "crystals": ("crystalline grains",), "instrument": ("musical instrument",), "play": ("perform on",),
    "played": ("performed on",), "composer": ("songwriter",), "ship": ("vessel",),
    "sailors": ("seamen", "crew members"),
    "served": ("worked",), "crew": ("complement",), "launched": ("first put to sea",), "carried": ("had",),
    # question words and function-like words (meaning-preserving swaps)
    "which": ("what",), "many": ("numerous",), "also": ("too",), "often": ("frequently",), "usually": ("typically",),
    "however": ("nevertheless",), "because": ("since",), "about": ("around",), "each": ("every",),
    "every": ("each",), "then": ("afterwards",), "after": ("following",), "before": ("prior to",),
    "quickly": ("rapidly",), "slowly": ("gradually",), "most": ("the majority of",), "almost": ("nearly",),
    "very": ("really",), "only": ("just",), "always": ("invariably",), "never": ("not ever",),
    "sometimes": ("at times",), "while": ("whereas",), "though": ("although",), "between": ("among",),
    "during": ("throughout",), "near": ("close to",), "later": ("afterwards",), "again": ("once more",),
    "together": ("jointly",), "enough": ("sufficient",), "rather": ("somewhat",), "whole": ("entire",),
    "total": ("overall",), "several": ("a number of",), "some": ("certain",), "other": ("different",),
    # verbs
    "make": ("produce",), "made": ("produced",), "makes": ("produces",), "said": ("stated",), "says": ("states",),
    "use": ("employ",), "used": ("employed",), "uses": ("employs",), "using": ("employing",), "find": ("discover",),
    "give": ("provide",), "gave": ("provided",), "gives": ("provides",), "take": ("grab",), "took": ("grabbed",),
    "begin": ("start",), "began": ("started",), "start": ("begin",), "started": ("began",), "end": ("finish",),
    "ended": ("finished",), "help": ("assist",), "helps": ("assists",), "helped": ("assisted",), "show": ("display",),
    "shows": ("displays",), "showed": ("displayed",), "need": ("require",), "needs": ("requires",),
    "needed": ("required",), "want": ("wish",), "wants": ("wishes",), "wanted": ("wished",), "think": ("believe",),
    "buy": ("purchase",), "buys": ("purchases",), "bought": ("purchased",), "sell": ("vend",), "sold": ("vended",),
    "pay": ("spend",), "paid": ("spent",), "get": ("obtain",), "gets": ("obtains",), "got": ("obtained",),
    "keep": ("retain",), "kept": ("retained",), "build": ("construct",), "built": ("constructed",),
    "increase": ("rise",), "increases": ("rises",), "decrease": ("decline",), "decreases": ("declines",),
    "produce": ("generate",), "produces": ("generates",), "contain": ("hold",), "contains": ("holds",),
    "include": ("comprise",), "includes": ("comprises",), "describe": ("depict",), "describes": ("depicts",),
    "explain": ("clarify",), "explains": ("clarifies",), "study": ("examine",), "studied": ("examined",),
    "choose": ("pick",), "chose": ("picked",), "answer": ("reply",), "answered": ("replied",), "ask": ("inquire",),
    "asked": ("inquired",), "walk": ("stroll",), "walked": ("strolled",), "run": ("jog",), "ran": ("jogged",),
    "eat": ("consume",), "ate": ("consumed",), "see": ("observe",), "saw": ("observed",), "look": ("glance",),
    "looked": ("glanced",), "tell": ("inform",), "told": ("informed",), "try": ("attempt",), "tried": ("attempted",),
    "leave": ("depart",), "left": ("departed",), "arrive": ("come",), "arrived": ("came",), "move": ("shift",),
    "moved": ("shifted",), "change": ("alter",), "changed": ("altered",), "changes": ("alters",),
    "receive": ("get",), "received": ("got",), "win": ("triumph",), "won": ("triumphed",), "lose": ("misplace",),
    "allow": ("permit",), "allows": ("permits",), "cause": ("trigger",), "causes": ("triggers",),
    "caused": ("triggered",), "live": ("reside",), "lives": ("resides",), "lived": ("resided",),
    # nouns
    "people": ("individuals",), "person": ("individual",), "children": ("kids",), "kids": ("children",),
    "child": ("kid",), "house": ("home",), "car": ("automobile",), "job": ("occupation",), "work": ("labour",),
    "student": ("pupil",), "students": ("pupils",), "teacher": ("instructor",), "book": ("volume",),
    "books": ("volumes",), "store": ("shop",), "shop": ("store",), "price": ("cost",), "money": ("cash",),
    "friend": ("pal",), "friends": ("pals",), "week": ("seven days",), "amount": ("quantity",),
    "question": ("query",), "example": ("instance",), "method": ("approach",), "result": ("outcome",),
    "results": ("outcomes",), "scientist": ("researcher",), "scientists": ("researchers",), "energy": ("power",),
    "plant": ("organism",), "plants": ("organisms",), "animal": ("creature",), "animals": ("creatures",),
    "earth": ("planet",), "rock": ("stone",), "rocks": ("stones",), "soil": ("earth",), "road": ("street",),
    "film": ("movie",), "movie": ("film",), "story": ("tale",), "company": ("firm",), "country": ("nation",),
    "government": ("administration",), "problem": ("issue",), "problems": ("issues",), "area": ("region",),
    "way": ("manner",), "part": ("portion",), "group": ("team",), "place": ("location",),
    "mother": ("mom",), "father": ("dad",), "woman": ("lady",), "man": ("gentleman",), "boy": ("lad",),
    "girl": ("lass",), "family": ("household",), "game": ("match",), "team": ("squad",), "player": ("athlete",),
    # adjectives
    "small": ("little",), "little": ("small",), "large": ("big",), "big": ("large",), "new": ("novel",),
    "old": ("aged",), "good": ("fine",), "bad": ("poor",), "important": ("significant",), "different": ("distinct",),
    "same": ("identical",), "first": ("initial",), "last": ("final",), "next": ("following",), "main": ("primary",),
    "correct": ("right",), "true": ("accurate",), "false": ("untrue",), "hot": ("warm",), "cold": ("chilly",),
    "happy": ("glad",), "sad": ("unhappy",), "easy": ("simple",), "hard": ("difficult",), "difficult": ("hard",),
    "fast": ("quick",), "slow": ("sluggish",), "possible": ("feasible",), "likely": ("probable",),
    "best": ("finest",), "great": ("excellent",), "common": ("frequent",), "large-scale": ("big",),
}  # fmt: skip

NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty")
_OPERATORS = set("=+-*/×÷<>%^")
_TOKEN = re.compile(r"[A-Za-z]+(?:-[A-Za-z]+)*|\d[\d,.]*|\s+|.", re.DOTALL)
_WORD = re.compile(r"[A-Za-z]+(?:-[A-Za-z]+)*")


def _pick(options: tuple[str, ...], key: str, position: int) -> str:
    if len(options) == 1:
        return options[0]
    digest = hashlib.sha256(f"{key}|{position}".encode()).digest()
    return options[digest[0] % len(options)]


def _match_case(original: str, replacement: str) -> str:
    if original.isupper() and len(original) > 1:
        return replacement.upper()
    if original[:1].isupper():
        return replacement[:1].upper() + replacement[1:]
    return replacement


def _rewrite_phrases(text: str) -> str:
    for source, target in PHRASES:
        pattern = re.compile(r"\b" + re.escape(source) + r"\b", re.IGNORECASE)
        text = pattern.sub(lambda m, t=target: _match_case(m.group(0), t), text)
    return text


def _spell(tokens: list[str], i: int) -> str | None:
    """A small standalone integer (between spaces, not in an expression like ``4*2``) as a word."""
    token = tokens[i]
    if not token.isdigit() or int(token) >= len(NUMBER_WORDS) or (len(token) > 1 and token[0] == "0"):
        return None
    before = tokens[i - 1] if i > 0 else " "
    after = tokens[i + 1] if i + 1 < len(tokens) else " "
    if not before.isspace() or not (after.isspace() or after in {",", ";"}):
        return None
    # "= 8", "8 + 2": a number next to an operator is part of arithmetic, not prose
    if (i >= 2 and tokens[i - 2] in _OPERATORS) or (i + 2 < len(tokens) and tokens[i + 2] in _OPERATORS):
        return None
    return NUMBER_WORDS[int(token)]


def paraphrase(text: str, key: str = "") -> str:
    """A meaning-preserving lexical rewording of ``text``; the same (text, key) gives the same output."""
    tokens = _TOKEN.findall(_rewrite_phrases(text))
    out: list[str] = []
    sentence_start = True
    for position, token in enumerate(tokens):
        spelled = _spell(tokens, position)
        if spelled is not None:
            token = spelled.capitalize() if sentence_start else spelled
            sentence_start = False
        elif _WORD.fullmatch(token):
            options = SYNONYMS.get(token.lower())
            is_name = token[:1].isupper() and not sentence_start  # "the Red Sea", "Mount X", "River"
            if options and not is_name:
                token = _match_case(token, _pick(options, key, position))
            sentence_start = False
        elif token.strip() in {".", "!", "?", "\n"} or "\n" in token:
            sentence_start = True
        out.append(token)
    return "".join(out)


def words(text: str) -> list[str]:
    """Lower-cased alphanumeric words (the normalisation n-gram decontamination uses)."""
    return re.findall(r"[a-z0-9]+", text.lower())


def changed_fraction(original: str, paraphrased: str) -> float:
    """Share of the original's word 8-grams that do not occur in the paraphrase (1.0 = none survive).

    Texts shorter than 8 words are compared as one n-gram. 8 is the shortest n-gram length the n-gram
    detectors use (GPT-2's 8-grams; GPT-3 uses 13).
    """
    a, b = words(original), words(paraphrased)
    n = min(8, len(a)) or 1
    grams_a = {tuple(a[i : i + n]) for i in range(max(1, len(a) - n + 1))}
    grams_b = {tuple(b[i : i + n]) for i in range(max(1, len(b) - n + 1))}
    if not grams_a:
        return 0.0
    return len(grams_a - grams_b) / len(grams_a)
