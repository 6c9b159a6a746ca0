"""Fine-tuning records: what an ``instruction``, ``chat`` or ``preference`` JSONL line must hold.

One reader for both sides: the submit check walks every line of the dataset with it (a missing
field names its line before the job queues), and the runtime reads the same parts from it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shipyard.errors import DatasetError
from shipyard.schemas.jobspec import DataSection, InstructionFields

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True, slots=True)
class Instruction:
    prompt: str
    """The prompt as the model reads it: the instruction, then the input when there is one."""
    response: str


def instruction_of(record: object, fields: InstructionFields, where: str) -> Instruction:
    if not isinstance(record, dict):
        raise _bad(where, "is not a JSON object", "each line must be one object")
    prompt = _text(record, fields.prompt, where, "data.fields.prompt")
    response = _text(record, fields.response, where, "data.fields.response")
    extra = record.get(fields.input) if fields.input else None
    if extra is not None and not isinstance(extra, str):
        raise _bad(
            where, f"field {fields.input!r} is not a string", "give the input as text, or leave it out"
        )
    return Instruction(prompt=fields.layout(prompt, extra), response=response)


def messages_of(record: object, field: str, where: str, needs_answer: bool = True) -> list[dict[str, str]]:
    if not isinstance(record, dict):
        raise _bad(where, "is not a JSON object", "each line must be one object")
    messages = record.get(field)
    if not isinstance(messages, list) or not messages:
        raise _bad(
            where,
            f"has no non-empty list {field!r}",
            "give each record a `messages` list of {role, content}, or set data.messages_field",
        )
    texts = []
    for number, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise _bad(
                where,
                f"message {number} is not {{role, content}} with a role of {', '.join(ROLES)}",
                'write each message as {"role": "user", "content": "..."}',
            )
        text = _content(message.get("content"))
        if text is None:
            raise _bad(
                where,
                f"message {number}'s content is neither text nor a list of text parts",
                'give it as "..." or [{"type": "text", "text": "..."}]; images and other parts are not '
                "trained on: drop them from the record",
            )
        texts.append({"role": message["role"], "content": text})
    if needs_answer and not any(m["role"] == "assistant" for m in texts):
        raise _bad(
            where, "has no assistant message: nothing to learn from", "drop the record or add the answer"
        )
    return texts


@dataclass(frozen=True, slots=True)
class Preference:
    """A preference pair: the prompt and two completions, as text or as message lists (TRL's
    "standard" and "conversational" forms)."""

    prompt: str | list[dict[str, str]]
    chosen: str | list[dict[str, str]]
    rejected: str | list[dict[str, str]]

    @property
    def chat(self) -> bool:
        return isinstance(self.chosen, list)


PAIR_HINT = (
    'write each pair as {"prompt": "...", "chosen": "...", "rejected": "..."}, or with message '
    'lists: {"prompt": [user turns], "chosen": [{"role": "assistant", ...}], "rejected": [...]}'
)


def preference_of(record: object, where: str) -> Preference:
    if not isinstance(record, dict):
        raise _bad(where, "is not a JSON object", "each line must be one object")
    chosen, rejected = record.get("chosen"), record.get("rejected")
    if isinstance(chosen, str) and isinstance(rejected, str):
        text = _text(record, "prompt", where, "a prompt field")
        return Preference(prompt=text, chosen=chosen, rejected=rejected)
    if isinstance(chosen, list) and isinstance(rejected, list):
        chosen_turns = messages_of(record, "chosen", where, needs_answer=False)
        rejected_turns = messages_of(record, "rejected", where, needs_answer=False)
        prompt: list[dict[str, str]]
        if "prompt" in record:
            prompt = messages_of(record, "prompt", where, needs_answer=False)
        else:  # TRL's implicit prompt: the turns both conversations share
            shared = 0
            while shared < min(len(chosen_turns), len(rejected_turns)) - 1:
                if chosen_turns[shared] != rejected_turns[shared]:
                    break
                shared += 1
            prompt, chosen_turns, rejected_turns = (
                chosen_turns[:shared],
                chosen_turns[shared:],
                rejected_turns[shared:],
            )
        for name, turns in (("chosen", chosen_turns), ("rejected", rejected_turns)):
            if not any(m["role"] == "assistant" for m in turns):
                raise _bad(where, f"{name} has no assistant turn: nothing to prefer", PAIR_HINT)
        return Preference(prompt=prompt, chosen=chosen_turns, rejected=rejected_turns)
    for name, value in (("chosen", chosen), ("rejected", rejected)):
        if value is None:
            present = ", ".join(sorted(record)[:8]) or "none"
            raise _bad(where, f"has no field {name!r} (its fields: {present})", PAIR_HINT)
    raise _bad(
        where,
        f"chosen is {json_kind(chosen) if not isinstance(chosen, str) else 'text'} and rejected is "
        f"{json_kind(rejected) if not isinstance(rejected, str) else 'text'}: a pair is two texts or "
        "two message lists",
        PAIR_HINT,
    )


def conversation_pairs(files: list[Path]) -> bool:
    """Whether a preference dataset's pairs are conversations (its first record says)."""
    for path in files:
        for _, record in records(path):
            return isinstance(record, dict) and isinstance(record.get("chosen"), list)
    return False


def _text(record: dict[str, Any], field: str, where: str, setting: str) -> str:
    value = record.get(field)
    if isinstance(value, str):
        return value
    if field in record:  # there, but not text: say what it is, not that it is missing
        raise _bad(
            where,
            f"field {field!r} is {json_kind(value)}, not text",
            f"write it as a JSON string, or set {setting} to the field that holds the text",
        )
    present = ", ".join(sorted(record)[:8]) or "none"
    raise _bad(
        where, f"has no field {field!r} (its fields: {present})", f"set {setting} to the field that holds it"
    )


def json_kind(value: object) -> str:
    """A JSON value's kind in words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    return "a list" if isinstance(value, list) else "an object"


def _content(content: object) -> str | None:
    """A message's text: a string, or the OpenAI form's list of parts whose text parts are joined;
    None when it is neither (a part that is not text included)."""
    if isinstance(content, str):
        return content
    if (
        isinstance(content, list)
        and content
        and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content
        )
    ):
        return "".join(part["text"] for part in content)
    return None


def _bad(where: str, problem: str, hint: str) -> DatasetError:
    return DatasetError(f"{where} {problem}", hint=hint)


def records(path: Path) -> Iterator[tuple[str, object]]:
    """``(file:line, record)`` for every non-empty line of a JSONL file."""
    with path.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as exc:
                raise _bad(
                    where, f"is not valid JSON ({exc.msg})", "each line must be one JSON object"
                ) from None


def check_records(data: DataSection, files: list[Path]) -> int:
    """Read every record of an ``instruction``, ``chat`` or ``preference`` dataset as the runtime
    will, raising on the first bad line; returns how many there are."""
    if data.format == "text":
        return 0
    count = 0
    for path in files:
        if path.suffix != ".jsonl":
            raise DatasetError(
                f"{path} is not a .jsonl file; data.format {data.format!r} reads JSON lines",
                hint="give .jsonl files, or data.format: text for plain text",
            )
        info = path.stat()
        count += _checked_file(
            str(path), info.st_size, info.st_mtime_ns, data.format, data.fields, data.messages_field
        )
    if count == 0:
        raise DatasetError(f"dataset {data.paths} holds no records", hint="point data.paths at JSONL records")
    return count


@functools.lru_cache(maxsize=256)
def _checked_file(
    path: str,
    size: int,  # noqa: ARG001 - with mtime_ns, the cache key: a changed file is read again
    mtime_ns: int,  # noqa: ARG001
    format: str,
    fields: InstructionFields,
    messages_field: str,
) -> int:
    count = 0
    for where, record in records(Path(path)):
        if format == "instruction":
            instruction_of(record, fields, where)
        elif format == "preference":
            preference_of(record, where)
        else:
            messages_of(record, messages_field, where)
        count += 1
    return count
