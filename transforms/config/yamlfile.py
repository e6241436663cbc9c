"""The YAML ``--config`` file, loaded safely, and the one-line errors of a model's validation."""

from __future__ import annotations

import difflib

import yaml
from pydantic import BaseModel, ValidationError

from tfrecord_etl.transforms.config.model import MAX_CONFIG_BYTES
from tfrecord_etl.transforms.errors import ConfigError


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses anchors/aliases (a 538-byte "billion laughs" file expands to
    gigabytes) and a key repeated in one mapping (last-wins would silently drop the first value)."""

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            mark = event.start_mark
            raise ConfigError(
                f"YAML anchors and aliases (&{event.anchor} / *{event.anchor}) are not allowed "
                f"in config files (line {mark.line + 1})",
                file=mark.name,
                hint="write the values out in full",
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: SafeLoader reports it
                continue
            line = key_node.start_mark.line + 1
            if first is not None:
                raise ConfigError(
                    f"Duplicate key {key!r} in the config file (line {line}, first on line {first})",
                    file=key_node.start_mark.name,
                    hint="keep one of them",
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: str, max_bytes: int = MAX_CONFIG_BYTES) -> dict:
    """A YAML mapping, loaded safely: no tags beyond plain YAML, no anchors/aliases, no repeated keys,
    at most ``max_bytes`` (1 MiB) read.

    Raises:
      ConfigError: a missing/unreadable or too large file, invalid YAML, an alias, a duplicate key.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as e:
        raise ConfigError(f"Cannot read config file: {e.strerror}", file=path) from None
    if len(raw) > max_bytes:
        raise ConfigError(
            f"The config file is larger than {max_bytes} bytes",
            file=path,
            hint="a config file holds a few options; pass large lists in a file of their own",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"The config file is not UTF-8 text (byte offset {e.start})", file=path) from None
    try:
        loader = _StrictLoader(text)
        loader.name = path
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        raise ConfigError(f"Invalid YAML: {str(e).splitlines()[0]}", file=path) from None
    except RecursionError:
        raise ConfigError("Invalid YAML: nested too deeply", file=path) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("The config file must hold a mapping of keys to values", file=path)
    return data


def validate(model: type[BaseModel], values: dict, source: str = "config"):
    """``model(**values)``, with a one-line ConfigError per problem (unknown key, wrong type, missing)."""
    try:
        return model(**values)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"]) or "?"
            if err["type"] == "extra_forbidden":
                close = difflib.get_close_matches(key, list(model.model_fields), n=1)
                problems.append(f"unknown key '{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
            elif err["type"] == "missing":
                problems.append(f"missing required key '{key}' (--{key})")
            else:
                problems.append(f"'{key}': {err['msg']} (got {err.get('input')!r})")
        raise ConfigError(
            f"Invalid {source}: " + "; ".join(problems), hint="see --help for every key, its type and default"
        ) from None
