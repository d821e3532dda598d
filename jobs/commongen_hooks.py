"""Hooks for the commongen job: one sentence, and which concepts it uses, inflections counted.

The task asks for one sentence, so coverage is measured on the first sentence of the
answer, as the task defines it; ``one_sentence`` says whether the answer is one, and
``coverage_any_sentence`` counts the concepts anywhere in it (what appending sentences
would raise). More than one sentence is a finding, and so is a note about the edit.

A concept counts as used when the sentence holds it or one of its inflected forms:
plural / third person (-s, -es, -ies, -ves), past (-ed, -d, -ied, doubled consonant),
-ing (e dropped, ie -> y, doubled consonant), and a small table of irregular forms.
The forms are generated generously (an odd form such as "runned" never appears in
a sentence, so over-generating is harmless); no dictionary, no dependencies.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pipeline.core.extraction import meta_commentary
from pipeline.core.metrics import MetricSpec

_WORD = re.compile(r"[^\W\d_]+")  # runs of letters
_VOWELS = frozenset("aeiou")
_SIBILANT_ENDS = ("s", "x", "z", "ch", "sh", "o")
# Every metric reads the answer and the concepts (shown to the model); none reads a label.
METRICS = {
    "coverage": MetricSpec("check", value_type="number"),
    "sentences": MetricSpec("check", better=None, value_type="number"),
    "one_sentence": MetricSpec("check", value_type="boolean"),
    "coverage_any_sentence": MetricSpec("check", value_type="number"),
}

# Irregular verbs and nouns common in everyday scenes; kept small on purpose.
_IRREGULAR: dict[str, tuple[str, ...]] = {
    "be": ("is", "am", "are", "was", "were", "been", "being"),
    "have": ("has", "had", "having"),
    "do": ("does", "did", "done"),
    "go": ("goes", "went", "gone"),
    "come": ("came",),
    "get": ("got", "gotten"),
    "make": ("made",),
    "take": ("took", "taken"),
    "give": ("gave", "given"),
    "see": ("saw", "seen"),
    "eat": ("ate", "eaten"),
    "drink": ("drank", "drunk"),
    "run": ("ran",),
    "sit": ("sat",),
    "stand": ("stood",),
    "lie": ("lay", "lain", "lying"),
    "lay": ("laid",),
    "throw": ("threw", "thrown"),
    "catch": ("caught",),
    "ride": ("rode", "ridden"),
    "drive": ("drove", "driven"),
    "write": ("wrote", "written"),
    "swim": ("swam", "swum"),
    "fly": ("flew", "flown", "flies"),
    "fall": ("fell", "fallen"),
    "hold": ("held",),
    "hang": ("hung",),
    "buy": ("bought",),
    "bring": ("brought",),
    "teach": ("taught",),
    "sell": ("sold",),
    "wear": ("wore", "worn"),
    "blow": ("blew", "blown"),
    "grow": ("grew", "grown"),
    "draw": ("drew", "drawn"),
    "sing": ("sang", "sung"),
    "begin": ("began", "begun"),
    "break": ("broke", "broken"),
    "shake": ("shook", "shaken"),
    "feed": ("fed",),
    "lead": ("led",),
    "dig": ("dug",),
    "spin": ("spun",),
    "hide": ("hid", "hidden"),
    "bite": ("bit", "bitten"),
    "shoot": ("shot",),
    "sweep": ("swept",),
    "sleep": ("slept",),
    "leave": ("left",),
    "build": ("built",),
    "find": ("found",),
    "fight": ("fought",),
    "stick": ("stuck",),
    "man": ("men",),
    "woman": ("women",),
    "child": ("children",),
    "person": ("people",),
    "foot": ("feet",),
    "tooth": ("teeth",),
    "mouse": ("mice",),
    "goose": ("geese",),
}


def _consonant(ch: str) -> bool:
    return ch.isalpha() and ch not in _VOWELS


def _cvc(word: str) -> bool:
    """Ends consonant-vowel-consonant (stop, plan, swim): the last letter may double."""
    return (
        len(word) >= 3
        and _consonant(word[-3])
        and word[-2] in _VOWELS
        and _consonant(word[-1])
        and word[-1] not in "wxy"
    )


def inflections(word: str) -> frozenset[str]:
    """The word and its inflected forms (lowercase)."""
    w = word.lower()
    forms = {w, *_IRREGULAR.get(w, ())}
    if len(w) < 2:
        return frozenset(forms)
    ends_consonant_y = w.endswith("y") and _consonant(w[-2])
    # plural / third person singular
    forms.add(w + "s")
    if w.endswith(_SIBILANT_ENDS):
        forms.add(w + "es")
    if ends_consonant_y:
        forms.add(w[:-1] + "ies")
    if w.endswith("fe"):
        forms.add(w[:-2] + "ves")
    elif w.endswith("f"):
        forms.add(w[:-1] + "ves")
    # past tense / participle
    if w.endswith("e"):
        forms.add(w + "d")
    elif ends_consonant_y:
        forms.add(w[:-1] + "ied")
    else:
        forms.add(w + "ed")
    # present participle
    if w.endswith("ie"):
        forms.add(w[:-2] + "ying")
    elif w.endswith("e") and not w.endswith(("ee", "ye", "oe")):
        forms.add(w[:-1] + "ing")
    else:
        forms.add(w + "ing")
    if _cvc(w):
        forms.update({w + w[-1] + "ed", w + w[-1] + "ing"})
    return frozenset(forms)


def _words(text: str) -> set[str]:
    # letters only: "dog's" -> "dog", "s"; "ice-skating" -> "ice", "skating"
    return set(_WORD.findall(text.lower()))


def uses(concept: str, sentence: str, words: set[str] | None = None) -> bool:
    """Whether ``sentence`` uses ``concept`` (in any inflected form)."""
    concept = concept.strip().lower()
    if not concept:
        return True
    if not concept.isalpha():  # a phrase or hyphenated concept: look for it as written
        return concept in sentence.lower()
    found = _words(sentence) if words is None else words
    return not found.isdisjoint(inflections(concept))


def missing(concepts: list[str], sentence: str) -> list[str]:
    """The concepts ``sentence`` does not use, in the given order."""
    words = _words(sentence)
    return [c for c in concepts if not uses(c, sentence, words)]


_SENTENCE_END = re.compile(r"[.!?]+[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])|\s*\n\s*")
_ABBREVIATIONS = frozenset({"mr", "mrs", "ms", "dr", "st", "jr", "sr", "vs", "etc", "prof", "mt"})


def sentences(text: str) -> list[str]:
    """The sentences of ``text``: split after . ! ? before a capital, and at line breaks."""
    out: list[str] = []
    start = 0
    for m in _SENTENCE_END.finditer(text):
        words = text[start : m.start()].split()
        if "\n" not in m.group(0) and words and words[-1].lower().strip(".") in _ABBREVIATIONS:
            continue  # "Mr. Smith": not the end of a sentence
        out.append(text[start : m.end()].strip())
        start = m.end()
    out.append(text[start:].strip())
    return [s for s in out if s]


def _concepts(fields: Mapping[str, Any]) -> list[str]:
    value = fields.get("concepts")
    if isinstance(value, str):  # tolerate "a, b, c"
        value = value.split(",")
    if not isinstance(value, list):
        return []
    return [str(c).strip() for c in value if str(c).strip()]


def _coverage(concepts: list[str], text: str) -> tuple[float, list[str]]:
    gone = missing(concepts, text)
    return (1.0 if not concepts else (len(concepts) - len(gone)) / len(concepts)), gone


def evaluate(fields: Mapping[str, Any], output: str) -> dict[str, Any]:
    """Coverage of the first sentence and its missing concepts, the sentence count, and
    ``coverage_any_sentence``."""
    concepts = _concepts(fields)
    parts = sentences(output)
    coverage, gone = _coverage(concepts, parts[0] if parts else "")
    anywhere, _ = _coverage(concepts, output)
    return {
        "coverage": round(coverage, 4),
        "missing": gone,
        "sentences": len(parts),
        "one_sentence": len(parts) == 1,
        "coverage_any_sentence": round(anywhere, 4),
    }


def check(fields: Mapping[str, Any], output: str) -> list[str]:
    """Findings: a note about the edit, more than one sentence, the missing concepts."""
    found = meta_commentary(output, "sentence")
    count = len(sentences(output))
    if count > 1:
        found.append(
            f"The answer has {count} sentences; the task asks for exactly one. Join them into "
            "one sentence (with commas, 'and', 'while', 'as'), keeping every word."
        )
    gone = missing(_concepts(fields), output)
    if gone:
        found.append(f"These words are missing and must be added: {', '.join(gone)}.")
    return found
