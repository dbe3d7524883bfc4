"""What is wrong with a document (a YAML file, a request body) that a pydantic model refused, in one message:
each unknown key with the key of its own section it most resembles, then the missing keys, else the first
error. The keys offered are those of the section the unknown key sits in (`changes.nodez` -> the keys of
`changes`), not the document's top level."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError


def validation_message(exc: ValidationError, model: type[BaseModel], also: Sequence[str] = ()) -> str:
    """`also`: top-level keys the caller reads itself, before the model (a scenario's `cluster` file)."""
    found = exc.errors()
    unknown = [e["loc"] for e in found if e.get("type") == "extra_forbidden"]
    missing = [_dotted(e["loc"]) for e in found if e.get("type") == "missing"]
    if not unknown and not missing:
        return first_error(exc)
    parts = []
    for loc in unknown:
        hint = did_you_mean(str(loc[-1]), keys_at(model, loc[:-1], also))
        parts.append(f"unknown key {_dotted(loc)!r}{hint}")
    if missing:
        parts.append(f"missing: {', '.join(missing)}")
    section = unknown[0][:-1] if unknown else ()
    named = [str(p) for p in section if not isinstance(p, int)]
    where = f" of {'.'.join(named)}" if named else ""
    return "; ".join(parts) + f" (known keys{where}: {', '.join(keys_at(model, section, also))})"


def unknown_keys(given: Iterable[Any], known: Sequence[str]) -> str | None:
    """For a document read without pydantic: its keys not in `known`, each with the known key it most
    resembles, and the known keys; None when every key is known."""
    unknown = sorted(str(k) for k in given if k not in known)
    if not unknown:
        return None
    parts = []
    for key in unknown:
        parts.append(f"unknown key {key!r}" + did_you_mean(key, known))
    return "; ".join(parts) + f" (known keys: {', '.join(known)})"


# Other names people give finetwin's fields (from training scripts, schedulers and other APIs), none of
# them close enough in spelling to be found as a misspelling: `seq_len` for `tokens_per_sample`. `model` is
# here because by spelling alone it is nearest to `gpu_model`.
SYNONYMS: dict[str, str] = {
    **dict.fromkeys(
        (
            "seq_len",
            "seqlen",
            "seq_length",
            "sequence_length",
            "max_seq_len",
            "max_seq_length",
            "max_length",
            "context_length",
            "tokens",
        ),
        "tokens_per_sample",
    ),
    **dict.fromkeys(("gpus", "n_gpus", "num_gpus", "gpu_count", "world_size"), "number_gpus"),
    **dict.fromkeys(("nodes", "n_nodes", "num_nodes", "node_count"), "number_nodes"),
    **dict.fromkeys(("model", "model_id", "llm", "base_model", "model_name_or_path"), "model_name"),
    **dict.fromkeys(("gpu", "gpu_type", "gpu_name", "accelerator"), "gpu_model"),
    **dict.fromkeys(("batch", "global_batch_size", "train_batch_size"), "batch_size"),
    **dict.fromkeys(("tuning_method", "finetuning_method", "peft"), "method"),
    "roce": "enable_roce",
    **dict.fromkeys(("time_limit", "timeout", "timeout_s"), "time_limit_s"),
    "status": "state",
    **dict.fromkeys(("page_size", "per_page", "size"), "limit"),
    "skip": "offset",
}


def closest(name: str, names: Iterable[str]) -> str | None:
    """The one of `names` that `name` most resembles, if any is close enough to be a misspelling of it, or
    that is `name` under another name (`SYNONYMS`, either way round: `seq_len` given for `tokens_per_sample`,
    or a header's `seq_len` where `tokens_per_sample` is missing)."""
    names = list(names)
    same = synonym_in(name, names)
    if same is not None:
        return same
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(name: str, names: Iterable[str]) -> str:
    """` (did you mean 'tokens_per_sample'?)` when one of `names` is the one `name` stands for (`closest`),
    else ''."""
    close = closest(name, names)
    return f" (did you mean {close!r}?)" if close else ""


def synonym_in(name: str, names: Iterable[str]) -> str | None:
    """The one of `names` that is `name` under another name (`SYNONYMS`, either way round), if any."""
    key = _spelled(name)
    for candidate in names:
        if SYNONYMS.get(key) == candidate or SYNONYMS.get(_spelled(candidate)) == name:
            return candidate
    return None


def _spelled(name: str) -> str:
    """`Seq-Len`, `seq len` -> `seq_len`: how SYNONYMS spells its keys."""
    return name.strip().lower().replace("-", "_").replace(" ", "_")


# pydantic's word that a default was not computed because another field failed: that other field's error
# says what to fix ("The default factory uses validated data, but at least one validation error occurred").
_CONSEQUENCES = frozenset({"default_factory_not_called"})


def causes(errors: Sequence[Any]) -> list[Any]:
    """pydantic's errors (`exc.errors()`) without those that only follow from another."""
    return [e for e in errors if e.get("type") not in _CONSEQUENCES] or list(errors)


def first_error(exc: ValidationError) -> str:
    """The first problem pydantic found, as `field.path: message`."""
    first = causes(exc.errors())[0]
    where = _dotted(first.get("loc", ()))
    said = plain_message(first.get("msg", "invalid"))
    return f"{where}: {said}" if where else said


def plain_message(message: object) -> str:
    """pydantic's message for a validator's own error without the word pydantic puts before it ("Value
    error, unknown GPU model ..."): the validator's sentence is written for the user already."""
    return str(message).removeprefix("Value error, ").removeprefix("Assertion failed, ")


def keys_at(model: type[BaseModel], path: Sequence[Any], also: Sequence[str] = ()) -> list[str]:
    """The field names of the model the document's `path` leads to (list indexes skipped), with `also` at
    the top level; the top level's where the path leaves the models (a free-form mapping)."""
    top = [*model.model_fields, *also]
    current = model
    for part in path:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(str(part))
        inner = _model_in(field.annotation) if field is not None else None
        if inner is None:
            return top
        current = inner
    return top if current is model else list(current.model_fields)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds: itself, or inside list[...], X | None, Annotated[...]."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (list, tuple, typing.Union, types.UnionType, typing.Annotated):
        for argument in typing.get_args(annotation):
            found = _model_in(argument)
            if found is not None:
                return found
    return None


def _dotted(loc: Sequence[Any]) -> str:
    return ".".join(str(p) for p in loc)
