"""What kind of text a request asks for, as the emulator's acceptance sees it.

A draft predicts a continuation best when the answer copies or edits text the prompt holds (a rewrite, a summary,
an extraction, a fix to given code) and worst for free prose; a draft trained on chat-formatted text predicts a raw
prompt's continuation less well. The emulator cannot read meaning, so it tells a request's category from the words
of its last user turn (or raw prompt), the same way for a served request and for its truth (sim/truth.py); the
profile's ``[acceptance.categories]`` say how much each category's drafts are accepted relative to chat.
"""
from __future__ import annotations

import re

#: the categories, checked in this order: the first whose words the instruction holds
CATEGORIES = ("code", "extraction", "rewrite", "math", "chat")
_WORDS = {
    "extraction": r"\b(extract|list (all|every|the)|pull out|as json|into json|json object|fields?:|parse the)\b",
    "rewrite": r"\b(rewrite|rephrase|paraphrase|summari[sz]e|summary|tl;?dr|proofread|correct the|fix the "
               r"(grammar|spelling|typos)|edit the|translate|shorten|make (this|it)( text)? shorter|condense|reformat|"
               r"convert the following)\b",
    "code": r"(```|\bdef |\bclass |\bfunction\b|\bpython\b|\bjavascript\b|\btypescript\b|\bsql\b|\brust\b|"
            r"\bbash\b|\bgo http\b|\bscript\b|\brefactor)",
    "math": r"(\bsolve\b|\bprove\b|\bcalculate\b|\bcompute\b|\bequation\b|\bintegral\b|\bderivative\b|"
            r"\bprobability\b|show (your|the) (working|steps)|how (much|many)\b.*\d|\d+\s*[+*^=]\s*\d+|\d+ [-/] \d+)",
}
_COMPILED = {name: re.compile(pattern, re.IGNORECASE) for name, pattern in _WORDS.items()}


#: a client's tag in front of a prompt ("[request 12] ", "[reference 0-3] "): not part of what is asked
_TAG = re.compile(r"\A\s*\[[^\]\n]{0,80}\]\s*")


def category_of(instruction: str) -> str:
    """The category of a request whose last user turn (or raw prompt) is ``instruction`` (a leading tag in brackets
    left out)."""
    head = _TAG.sub("", instruction[:2000])
    for name in CATEGORIES[:-1]:
        if _COMPILED[name].search(head):
            return name
    return "chat"
