"""Which word of a passage the name cloze masks: a deterministic proper-name finder (no NER model).

Chang et al. (2023) find person names with BookNLP's named-entity tagger and keep passages holding exactly
one name and no other named entity. No NER model installs offline here (spaCy's English pipelines and
NLTK's data are downloads from outside the package index), so the choice is a documented heuristic on
capitalisation and a few word lists:

1. words are runs of letters with inner apostrophes and hyphens (``O'Neill``, ``Smith-Jones``); a trailing
   possessive ``'s`` / ``’s`` is not part of the name (``Betty's`` masks ``Betty``, leaving ``[MASK]'s``);
   HTML line breaks (``<br />``, IMDB) become newlines first;
2. a *candidate* is capitalised (upper-case first letter, some lower-case letter after it: all-caps
   acronyms such as ``BBC`` or a shouted ``MACHINE`` never are), at least ``min_len`` letters, not a
   contraction (``I'm``), and **not at the start of a sentence** (text start, a newline, or after
   ``. ! ? : ;`` and any opening quotes or brackets), where capitals say nothing;
3. it is not in a word list of capitalised non-names: function words (TS-Guessing's ``STOP_WORDS``),
   interjections and chat words (``OK``, ``Lol``, ``Thanks``), days, months, holidays, nationalities,
   languages and frequent country names (``NOT_NAMES``; their plurals and ``-man`` / ``-woman`` forms too),
   titles and kinship words (``TITLES``: ``Mr``, ``Dr``, ``Uncle``);
4. it occurs **exactly once in the whole passage**, counted case-insensitively over every word and every
   part of a hyphenated word (so neither ``Will`` beside "will" nor ``Jones`` beside ``Smith-Jones``): once
   masked, the answer is nowhere in plain sight, as in the paper's single-name passages;
5. a *name run* is a maximal sequence of capitalised words joined by single spaces, name particles
   (``van``, ``de``, ``al`` ...) inside it; a run holding a word of ``ORG_PLACE_WORDS`` (``Council``,
   ``River``, ``United``, ``North``, ``St`` ...) names an organisation or place, and none of its words is a
   candidate;
6. SAMSum speaker labels (``Amanda:`` at the start of a line, ``SPEAKER``) count as occurrences of the
   name but are never masked themselves: masking a speaker asks who said a line, which the turn-taking
   of a two-person chat gives away (the paper's passages are chosen so context cannot give the name);
   a name mentioned once inside the dialogue (``Ask Larry``) is a candidate like any other;
7. ``evidence`` that the candidate is a *person's* name: 2 when a title or role word stands right
   before its run (``Mr``, ``Dr``, ``director``, ``wife``: ``TITLES``, ``ROLE_WORDS``) or a speech verb
   or an apposition right after it (``said``, ``told``, ``, who``, ``, aged``, ``, 34,``: ``SPEECH``);
   1 when its run holds two to four capitalised words not at a sentence start (a full name: ``Stephen
   Williams``; ``Ask Larry`` at a line start is one); 0 otherwise (a lone
   capitalised word: ``Larry``, but also ``Rio`` or ``Netflix``). Candidates below ``min_evidence``
   are dropped; of the rest the one with most evidence is masked, the first in the text on ties.

Weaknesses (measured and tested in ``tests/test_name_cloze.py``): it finds *proper nouns*, not person
names - at ``min_evidence`` 0 a once-mentioned place, brand or team (``Rio``, ``Netflix``, ``Chinnor``)
is masked as readily as a person, and two-word places or teams the word lists miss (``Old Elthamians``,
``Hong Kong``) get the full-name evidence 1; only evidence 2 is mostly people. Names at the start of a
sentence are never found, and a name whose surname or first name also appears elsewhere is masked with
the rest of the full name in sight (``[MASK] Williams``), as BookNLP's one-word names were not; other
named entities stay in the passage (the paper drops passages with any), so the context can help a
model guess. Lower-cased names (chat: ``larry``) and names written in capitals are missed.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from contamray.methods.closed.ts_words import STOP_WORDS

_WORD = re.compile(r"[^\W\d_]+(?:['’\-][^\W\d_]+)*")
_POSSESSIVE = re.compile(r"['’][sS]$")
_CONTRACTION = re.compile(r"['’](?:m|ll|re|ve|d|t)$", re.IGNORECASE)
_BREAK = re.compile(r"<br\s*/?>", re.IGNORECASE)
# after these (and any quotes, brackets or dashes) a capital starts a sentence
_SENTENCE_END = ".!?:;…>"
_OPENERS = "\"'“”‘’([{*-–—•"
# "Name:" (one to three words) at the start of a line: a dialogue's speaker label
SPEAKER = re.compile(r"(?m)^[ \t]*((?:[^\W\d_][\w'’.\-]*)(?: [^\W\d_][\w'’.\-]*){0,2})[ \t]*:")

TITLES = frozenset(
    """
    mr mrs ms miss mx dr prof professor sir dame lord lady baroness baron rev reverend fr judge justice
    capt captain sgt sergeant insp inspector det detective supt superintendent constable pc cllr councillor
    president chancellor minister secretary senator sen rep gov governor mayor king queen prince princess
    duke duchess earl pope bishop archbishop cardinal general gen colonel col major maj lieutenant lt admiral
    commander commissioner coach aunt auntie uncle grandma grandpa granny grandad nan cousin ch
    """.split()
)
ROLE_WORDS = frozenset(
    """
    director manager chairman chairwoman chair spokesman spokeswoman spokesperson striker midfielder defender
    goalkeeper keeper winger player leader chief executive founder owner actor actress singer star author
    writer novelist poet artist producer presenter host husband wife son daughter brother sister mother father
    mum mom dad friend boyfriend girlfriend partner boss colleague teacher doctor nurse officer mp msp mep
    boxer champion rider driver cyclist runner batsman bowler skipper lawyer solicitor barrister prosecutor
    analyst economist researcher scientist campaigner resident victim suspect defendant team-mate teammate
    compatriot rival opponent chef drummer guitarist rapper comedian journalist correspondent editor reporter
    grandmother grandfather nephew niece ceo head headteacher fly-half scrum-half forward centre-back full-back
    """.split()
)
SPEECH = frozenset(
    """
    said says told tells added adds explained explains wrote writes asked asks replied insisted admitted claimed
    stated revealed warned commented continued recalled argued believes believed thinks thought announced
    confirmed described urged
    """.split()
)
PARTICLES = frozenset("van von de der den da di du del della dos la le bin ibn al el ter ten".split())
ORG_PLACE_WORDS = frozenset(
    """
    council university college school club united city county district borough street road avenue lane way
    drive place square bridge park gardens river lake sea ocean bay island islands isle mountain mountains mount
    valley forest hill hills coast beach harbour port station airport hospital church cathedral chapel museum
    gallery theatre theater centre center stadium arena hotel bank group company corporation co ltd inc plc llc
    party court house hall office ministry department agency authority service services police army force
    forces navy government parliament assembly commission committee association federation union league cup
    championship championships trophy open games olympics olympic festival awards award prize act bill report
    review trust foundation institute society network news times post herald guardian mail telegraph express
    radio tv television channel records studios pictures north south east west northern southern eastern
    western central new upper lower great greater kingdom republic state states empire province region village
    town castle palace tower estate farm prison academy board senate congress tribunal inquiry summit
    conference world international national royal rovers rangers athletic wanderers albion city fc rfc afc
    county premier division series tour show festival street sport sports media press st saint
    """.split()
)
NOT_NAMES = frozenset(
    """
    i ok okay yeah yep yes no nope hi hey hello thanks thank please sorry lol omg wow haha hahaha oh ah um uh
    hmm bye dear congrats cool great good sure well maybe god gosh damn yay ugh xd btw idk im ill ive id last next
    jr jnr sr snr mon tue tues wed thu thur thurs fri sat sun jan feb mar apr jun jul aug sep sept oct nov dec
    monday tuesday wednesday thursday friday saturday sunday january february march april may june july
    august september october november december christmas xmas easter halloween ramadan valentine
    english british scottish welsh irish american european african asian australian canadian french german
    dutch spanish italian portuguese russian chinese japanese korean indian pakistani polish greek turkish
    swedish norwegian danish finnish swiss belgian austrian mexican brazilian argentine israeli palestinian
    syrian iraqi iranian afghan egyptian nigerian kenyan muslim christian jewish catholic protestant hindu
    buddhist islamic arab latin western eastern internet web tv mum mom dad mummy daddy
    spaniard scot brit briton kiwi aussie jordanian lebanese saudi qatari emirati yemeni libyan tunisian moroccan
    algerian sudanese ethiopian somali ugandan ghanaian zimbabwean chilean colombian venezuelan peruvian cuban
    jamaican ukrainian belarusian czech slovak hungarian romanian bulgarian serbian croatian bosnian albanian
    kosovan georgian armenian kazakh thai vietnamese indonesian malaysian filipino taiwanese bangladeshi lankan
    nepalese kurdish kurd sikh caribbean latino hispanic nordic scandinavian
    england scotland wales ireland britain europe africa asia america australia canada china japan india pakistan
    russia ukraine france germany spain italy portugal greece turkey syria iraq iran afghanistan israel egypt
    nigeria kenya brazil argentina mexico netherlands belgium switzerland austria sweden norway denmark finland
    poland korea
    """.split()
)


@dataclass(frozen=True)
class Name:
    """A maskable name in a passage: the word, where it is, and how much says it is a person's."""

    word: str
    start: int
    end: int
    evidence: int


@dataclass(frozen=True)
class Cloze:
    """A passage window with the name replaced by the mask, and the name."""

    text: str
    name: Name
    n_words: int


def clean(text: str) -> str:
    """HTML line breaks as newlines (IMDB reviews); nothing else changes."""
    return _BREAK.sub("\n", text)


def _capitalised(word: str) -> bool:
    """Upper-case first letter and some lower-case letter after it; not an acronym's plural (``MPs``)."""
    return word[0].isupper() and any(c.islower() for c in word[1:]) and not (len(word) > 2 and word[:-1].isupper())


def _sentence_start(text: str, start: int) -> bool:
    """Whether the word at ``start`` begins a sentence or a line (quotes and brackets skipped)."""
    i = start - 1
    while i >= 0 and (text[i] in " \t" or text[i] in _OPENERS):
        i -= 1
    return i < 0 or text[i] == "\n" or text[i] in _SENTENCE_END


def _words(text: str) -> list[tuple[str, int, int]]:
    """(word without a possessive, start, end) of every word of ``text``."""
    out = []
    for m in _WORD.finditer(text):
        word = _POSSESSIVE.sub("", m.group())
        if word:
            out.append((word, m.start(), m.start() + len(word)))
    return out


def _not_a_name(low: str) -> bool:
    """A listed non-name, or its plural or "-man" / "-woman" form (``Americans``, ``Dutchwoman``)."""
    if low in NOT_NAMES:
        return True
    stems = [low[: -len(suffix)] for suffix in ("s", "man", "woman", "men", "women") if low.endswith(suffix)]
    return any(len(stem) >= 3 and stem in NOT_NAMES for stem in stems)


def _joins(word: str) -> bool:
    """A capitalised word that can be part of a name run (not a title, function word or listed non-name)."""
    low = word.lower()
    return _capitalised(word) and low not in TITLES and low not in STOP_WORDS and not _not_a_name(low)


def _runs(text: str, found: list[tuple[str, int, int]]) -> list[list[int]]:
    """Maximal runs of capitalised words (indices into ``found``) separated by one space; name particles
    between capitalised words belong to the run; a possessive, a comma or any other gap ends it."""
    runs: list[list[int]] = []
    current: list[int] = []
    for i, (word, start, _) in enumerate(found):
        adjacent = bool(current) and text[found[i - 1][2] : start] == " "
        if adjacent and (_joins(word) or word.lower() in PARTICLES):
            current.append(i)
            continue
        if current:
            runs.append(current)
        current = [i] if _joins(word) else []
    if current:
        runs.append(current)
    trimmed = []
    for run in runs:
        while not _joins(found[run[-1]][0]):
            run = run[:-1]  # trailing particles
        trimmed.append(run)
    return trimmed


def _person_evidence(text: str, found: list[tuple[str, int, int]], run: list[int]) -> int:
    """2: a title, role word or speech verb right before the run, or a speech verb or an apposition right
    after it; 1: a run of two to four capitalised words; 0: a lone word."""
    first, last = run[0], run[-1]
    if first > 0:
        prev, _, prev_end = found[first - 1]
        cue = prev.lower() in TITLES or prev.lower() in ROLE_WORDS or prev.lower() in SPEECH
        if cue and text[prev_end : found[first][1]].strip(" .") == "":
            return 2
    rest = re.sub(r"^['’]s\b", "", text[found[last][2] : found[last][2] + 40])
    verb = re.match(r"\s+([^\W\d_]+)", rest)
    if verb and verb.group(1).lower() in SPEECH:
        return 2
    if re.match(r",\s+(?:who|whose|aged)\b|,\s+\d{1,3}\s*,|\s+\(\d{1,3}\)", rest):
        return 2
    n_cap = sum(1 for i in run if _joins(found[i][0]) and not _sentence_start(text, found[i][1]))
    return 1 if 2 <= n_cap <= 4 else 0


def speaker_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of every speaker label ("Amanda:" at a line start) of ``text``."""
    return [m.span(1) for m in SPEAKER.finditer(text)]


def find_names(text: str, min_len: int = 2, min_evidence: int = 0) -> list[Name]:
    """The maskable names of ``text`` (module docstring), most evidence first, then in text order."""
    found = _words(text)
    counts: Counter[str] = Counter()
    for word, _, _ in found:
        low = word.lower()
        counts[low] += 1
        if "-" in low:
            counts.update(p for p in low.split("-") if p)
    labels = speaker_spans(text)
    names = []
    for run in _runs(text, found):
        words = [found[i][0] for i in run]
        if any(w.lower() in ORG_PLACE_WORDS for w in words):
            continue
        evidence = _person_evidence(text, found, run)
        for i in run:
            word, start, end = found[i]
            low = word.lower()
            if (
                len(word) < min_len
                or not _capitalised(word)
                or _CONTRACTION.search(word)
                or low in STOP_WORDS
                or _not_a_name(low)
                or low in TITLES
                or low in PARTICLES
                or counts[low] != 1
                or any(counts[p] != 1 for p in low.split("-") if p and "-" in low)
                or any(a <= start < b for a, b in labels)
                or _sentence_start(text, start)
                or evidence < min_evidence
            ):
                continue
            names.append(Name(word, start, end, evidence))
    return sorted(names, key=lambda n: (-n.evidence, n.start))


def window(text: str, start: int, end: int, n_words: int) -> tuple[int, int]:
    """Character span of at most ``n_words`` whitespace-separated words of ``text`` holding ``start:end``: centred
    on it, shifted inward at the passage's ends, then started at the first sentence or line start before the
    name (a window does not open mid-sentence when it can help it); 0 = the whole text."""
    tokens = [m.span() for m in re.finditer(r"\S+", text)]
    if n_words <= 0 or len(tokens) <= n_words:
        return (tokens[0][0], tokens[-1][1]) if tokens else (0, len(text))
    k = next((i for i, (a, b) in enumerate(tokens) if start < b), len(tokens) - 1)
    lo = max(0, k - (n_words - 1) // 2)
    hi = min(len(tokens), lo + n_words)
    lo = max(0, hi - n_words)
    if lo > 0:
        lo = next((i for i in range(lo, k + 1) if _sentence_start(text, tokens[i][0])), lo)
        hi = min(len(tokens), lo + n_words)
    return tokens[lo][0], tokens[hi - 1][1]


def cloze(text: str, n_words: int = 50, min_len: int = 2, min_evidence: int = 0, mask: str = "[MASK]") -> Cloze:
    """Mask the best name of ``text`` (``find_names``) and cut a window of ``n_words`` words around it;
    ValueError when the passage has no maskable name."""
    text = clean(text)
    names = find_names(text, min_len, min_evidence)
    if not names:
        raise ValueError(
            f"no capitalised word that occurs once mid-sentence with person evidence >= {min_evidence}: no "
            "maskable name"
        )
    name = names[0]
    a, b = window(text, name.start, name.end, n_words)
    shown = text[a : name.start] + mask + text[name.end : b]
    return Cloze(shown, name, len(text[a:b].split()))
