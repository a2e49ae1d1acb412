"""Configuration mistakes: the port behaves as if one value of the model's configuration were
another.

A reference built from a configuration object (`config = "transformers.LlamaConfig"`, or a
checkpoint's `config.json`) reads its fields in many places: a rotary base in the rotary
embedding's constructor, a switch in a decoder layer's forward, per-layer lists in the mask
functions. A port that reads one of them wrong — not at all (the class default, or the code's
fallback when the field is absent), under its transformers-4 name (a transformers-5
`config.json` keeps `rope_theta` inside `rope_parameters`), a boolean the other way, a size off by
one, the value of a sibling field, a feature applied on every layer where the configuration selects
some — computes what the reference computes with that value changed. So the diagnosis
(:mod:`golden_ref.mutations`) builds the reference again with one value changed, and the runtime
names the change under which it becomes the port: "the port behaves as if `<field>` were `<value>`
(the config says `<value>`)", with where the reference reads it.

`Reads` watches the configuration object while the reference is recorded: every field read, and
where (the reference's source line, or golden's own driving for the masks and positions it builds
from the configuration). `alternatives` lists the values a port plausibly uses instead, and
`Change` builds the configuration with one of them.
"""

from __future__ import annotations

import copy
import math
import os
import sys

from .sites import display_path, internal, source_line

# Fields that say nothing about the computation of a model in eval mode, or only about its shapes
# (a change there cannot load the case's weights), or about what it returns.
_IGNORED = frozenset((
    "architectures", "model_type", "transformers_version", "dtype", "torch_dtype", "use_cache",
    "output_attentions", "output_hidden_states", "return_dict", "use_return_dict", "id2label",
    "label2id", "problem_type", "chunk_size_feed_forward", "is_encoder_decoder", "initializer_range",
    "tie_word_embeddings", "vocab_size", "name_or_path", "pruned_heads", "tokenizer_class",
    "prefix", "task_specific_params", "finetuning_task", "num_labels", "tp_plan", "pp_plan",
    "base_model_tp_plan", "base_model_pp_plan", "attn_implementation",
))
_IGNORED_SUFFIXES = ("_token_id", "_token_ids", "dropout", "_dropout_prob", "_dropout_rate",
                     "_init_std", "_initializer_range", "_plan", "dtype")
# The activations a port picks among (transformers' names).
_ACTIVATIONS = ("gelu", "gelu_pytorch_tanh", "gelu_new", "silu", "relu", "quick_gelu", "gelu_fast")
# Values a rotary base, an eps take in other models of the same families.
_THETAS = (10000.0, 500000.0, 1000000.0)
_EPS = (1e-5, 1e-6, 1e-12, 1e-8)
# Words of a field whose value 1 (1.0) means "not used": a fraction, a factor, a scale.
_FACTOR_WORDS = ("factor", "pct", "fraction", "ratio", "multiplier", "scale", "scaling")
# Files whose reads are the configuration's own (validation, serialisation, derived defaults).
_CONFIG_FILES = ("configuration_utils.py", os.path.join("huggingface_hub", "dataclasses.py"))
_DRIVING = os.path.join("golden_ref", "schedule.py")
_ATTENTION_KINDS = ("full_attention", "sliding_attention")
# Lists of one entry per layer whose entries select what a layer does (`layer_types`).
_PER_LAYER_WORDS = ("layer_types", "layers_block_type", "block_types", "attention_types")


def _fmt(value) -> str:
    if isinstance(value, float):
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            mantissa, exponent = f"{value:.6g}".split("e") if "e" in f"{value:.6g}" else (None, None)
            if mantissa is not None:
                return f"{mantissa}e{int(exponent)}"
        return repr(value)
    if isinstance(value, list) and len(value) > 1 and all(v == value[0] for v in value):
        return f"[{value[0]!r}] * {len(value)}"
    return repr(value)


def _path_text(path) -> str:
    return path[0] if len(path) == 1 else f"{path[0]}['{path[1]}']"


class Read:
    """One field the reference reads: its value and where (places, in order of first read)."""

    __slots__ = ("path", "value", "places", "codes")

    def __init__(self, path, value):
        self.path = path
        self.value = value
        self.places = []
        self.codes = []

    def at(self, place, code):
        if place not in self.places and len(self.places) < 8:
            self.places.append(place)
            self.codes.append(code)


def _own(frame, config) -> bool:
    """Whether the frame is one of the configuration's own methods (its `__init__`, `to_dict`,
    a property)."""
    code = frame.f_code
    return code.co_argcount > 0 and code.co_varnames[0] == "self" and frame.f_locals.get("self") is config


def _reading_place(frame, config):
    """Where a read happens: the first frame outside the configuration's own code, as
    (`file:line`, source line); (None, None) for a read by torch, the standard library or golden
    (but golden's driving: masks and positions it builds from the configuration)."""
    while frame is not None:
        name = frame.f_code.co_filename
        if name.endswith(_CONFIG_FILES) or _own(frame, config):
            frame = frame.f_back
            continue
        if name.endswith(_DRIVING):
            return "golden's driving (the masks and positions it builds from the configuration)", None
        if internal(name):
            return None, None
        return f"{display_path(name)}:{frame.f_lineno}", source_line(frame)
    return None, None


class _WatchedDict(dict):
    """A dict-valued field (`rope_parameters`) whose key reads are recorded."""

    def __init__(self, value, reads, field):
        super().__init__(value)
        self._reads = reads
        self._field = field

    def _note(self, key):
        if isinstance(key, str):
            self._reads.note((self._field, key), dict.get(self, key), sys._getframe(2))

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._note(key)
        return super().get(key, default)

    def __deepcopy__(self, memo):
        # A copy of the configuration (the driving deep-copies the module) is read as the
        # reference's too.
        return _WatchedDict(copy.deepcopy(dict(self), memo), self._reads, self._field)

    def copy(self):
        return _WatchedDict(dict(self), self._reads, self._field)


class Reads:
    """The fields of a configuration object the reference reads, and where."""

    def __init__(self):
        self.fields = {}  # path -> Read
        self.config = None
        self.active = True

    def watch(self, config):
        """Record reads of `config` from now on (its class swapped for a watching subclass, its
        dict-valued fields for watched copies). Returns it."""
        if config is None or self.config is not None or not _is_config(config):
            return config
        reads = self
        cls = type(config)
        aliases = getattr(cls, "attribute_map", {}) or {}
        names = _field_names(config)

        class Watched(cls):
            def __getattribute__(self, key):
                value = super().__getattribute__(key)
                if reads.active and not key.startswith("_"):
                    canonical = aliases.get(key, key)
                    if canonical in names:
                        reads.note((canonical,), value, sys._getframe(1))
                return value

        Watched.__name__ = cls.__name__
        Watched.__qualname__ = cls.__qualname__
        Watched.__module__ = cls.__module__
        for name in names:
            value = config.__dict__.get(name)
            if isinstance(value, dict) and all(isinstance(k, str) for k in value):
                object.__setattr__(config, name, _WatchedDict(value, self, name))
        config.__class__ = Watched
        self.config = config
        return config

    def note(self, path, value, frame):
        if not self.active or any(_ignored(p) for p in path):
            return
        place, code = _reading_place(frame, self.config)
        if place is None:
            return
        read = self.fields.get(path)
        if read is None:
            read = self.fields[path] = Read(path, dict(value) if isinstance(value, dict) else value)
        read.at(place, code)

    def stop(self):
        self.active = False


def _is_config(obj) -> bool:
    return hasattr(obj, "to_dict") and not isinstance(obj, dict)


def _field_names(config) -> frozenset:
    names = set(getattr(type(config), "__dataclass_fields__", {}) or {})
    names |= {k for k in vars(config) if not k.startswith("_")}
    return frozenset(n for n in names if not callable(getattr(type(config), n, None)))


def _ignored(name: str) -> bool:
    return name in _IGNORED or name.endswith(_IGNORED_SUFFIXES) or name.startswith("_")


class Change:
    """One configuration mistake: `values` ((path, value) pairs, usually one) set on the
    configuration the reference is built from; `whys` says what each value is to a port (the class
    default, the switch the other way, ...); `reads` is the Read of each path."""

    def __init__(self, values, whys, reads, weights=None):
        self.values = values
        self.whys = whys
        self.reads = reads
        self.weights = weights or {}  # file -> how many of the configuration's reads it makes

    @property
    def key(self) -> str:
        return "config|" + "|".join(f"{_path_text(p)}={v!r}" for p, v in self.values)

    def what(self) -> str:
        return " and ".join(f"`{_path_text(p)}` were {_fmt(v)}" for p, v in self.values)

    def instead(self) -> str:
        return " and ".join(f"{_fmt(r.value)}" for r in self.reads)

    def where(self) -> str:
        from .sites import join_places

        places = []
        for r in self.reads:
            for p in r.places:
                if p not in places and not p.startswith("golden's"):
                    places.append(p)
        # The model's own file first: the file that reads the configuration most (a mask
        # function or a cache that reads a field too comes after).
        places.sort(key=lambda p: -self.weights.get(p.rpartition(":")[0], 0))
        if not places:
            driving = [p for r in self.reads for p in r.places]
            return driving[0] if driving else ""
        return join_places(places[:3])

    def code(self):
        for r in self.reads:
            for place, code in zip(r.places, r.codes):
                if code is not None and not place.startswith("golden's"):
                    return code
        return None

    def fix(self) -> str:
        parts = []
        nested = None
        for (path, value), why in zip(self.values, self.whys):
            parts.append(f"{_fmt(value)} for `{_path_text(path)}` is {why}")
            if len(path) == 2:
                nested = path
        text = "the port's " + "; its ".join(parts)
        text += " — read the value from the configuration and use it where the reference does"
        if nested is not None:
            text += (f" (transformers 5 keeps `{nested[1]}` inside `{nested[0]}`, in config.json too: a port "
                     f"that reads a top-level `{nested[1]}` gets its default)")
        return text

    def build(self, config_class, keywords):
        """The configuration object with this change: built from the keywords with the changed
        top-level values (so that what the configuration derives from them follows, as it would
        for a port reading them), then each value set as the port reads it."""
        top = {p[0]: v for p, v in self.values if len(p) == 1}
        try:
            config = config_class(**{**keywords, **top})
        except Exception:
            config = config_class(**keywords)
        for path, value in self.values:
            if len(path) == 1:
                if _get(config, path) != value:
                    object.__setattr__(config, path[0], value)
            else:
                inner = dict(getattr(config, path[0]) or {})
                if value is _ABSENT:
                    inner.pop(path[1], None)
                else:
                    inner[path[1]] = value
                object.__setattr__(config, path[0], inner)
        return config


class _Absent:
    def __repr__(self):
        return "absent"


_ABSENT = _Absent()


def _get(config, path):
    value = getattr(config, path[0], None)
    if len(path) == 2:
        return value.get(path[1]) if isinstance(value, dict) else None
    return value


def _default_of(config_class, path):
    try:
        default = config_class()
    except Exception:
        return _ABSENT
    try:
        return _get(default, path) if len(path) == 1 or isinstance(getattr(default, path[0], None), dict) else _ABSENT
    except Exception:
        return _ABSENT


def _words(name: str) -> list:
    return name.split("_")


def _numeric(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def alternatives(read: Read, config_class, reads: dict, given=None) -> list:
    """The values a port plausibly reads for this field instead, as (value, why). `given`: the
    keywords the configuration was built from (a value given there that the configuration sets
    aside — a window with `use_sliding_window: false` — is what a port reading config.json gets)."""
    path, value = read.path, read.value
    name = path[-1]
    out = []
    raw = (given or {}).get(name) if len(path) == 1 else None

    def add(v, why):
        if v is _ABSENT and len(path) == 1:
            return
        if v is not _ABSENT and (v == value and type(v) is type(value)):
            return
        if isinstance(v, float) and isinstance(value, float) and math.isclose(v, value, rel_tol=1e-9):
            return
        if all(o[0] is not v and o[0] != v for o in out):
            out.append((v, why))

    default = _default_of(config_class, path)
    if raw is not None and not isinstance(raw, bool) and _numeric(raw) and raw != value:
        switch = _switch_for(config_class, given, name, raw)
        aside = f" because `{switch[0]}` is {switch[1]}" if switch else ""
        add(raw, f"the value given ({_fmt(raw)}), which the configuration sets aside{aside}")
        if isinstance(raw, int):
            add(raw + 1, f"one more than the value given ({_fmt(raw)}), which the configuration sets aside{aside}")
            if raw > 1:
                add(raw - 1, f"one less than the value given ({_fmt(raw)}), which the configuration sets "
                             f"aside{aside}")
    if isinstance(value, bool):
        add(not value, "the switch the other way")
        return out
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        if name in _PER_LAYER_WORDS or name.endswith("_types"):
            kinds = list(dict.fromkeys(value))
            if all(k.endswith("_attention") for k in kinds):
                # The two kinds of attention layer every model with windows has.
                kinds += [k for k in _ATTENTION_KINDS if k not in kinds]
            for kind in kinds:
                add([kind] * len(value), f"'{kind}' on every layer, where the configuration selects per layer")
        return out
    if isinstance(value, str):
        if name.endswith(("act", "activation", "act_fn")):
            for a in _ACTIVATIONS:
                add(a, "another activation")
        if default is not _ABSENT and isinstance(default, str):
            add(default, "the class default")
        return out
    if value is None:
        if default is not _ABSENT and default is not None:
            add(default, "the class default")
        return out
    if not _numeric(value):
        return out
    if default is not _ABSENT and (default is None or _numeric(default)):
        add(default, "the class default" if len(path) == 1 else "its default")
    words = _words(name)
    if isinstance(value, float) or isinstance(default, float):
        if any(w in words for w in _FACTOR_WORDS) or name.endswith("_pct"):
            add(1.0, "1: the factor not applied")
        if "eps" in words or name.endswith("eps"):
            for e in _EPS:
                add(e, "another model's eps")
        if "theta" in words or "base" in words:
            for t in _THETAS:
                add(t, "another model's rotary base")
        if "softcapping" in words or "cap" in words:
            add(None, "None: no soft-capping")
    if isinstance(value, int):
        if value > 1:
            add(value - 1, "one less")
        add(value + 1, "one more")
        if "window" in words:
            add(None, "None: no window")
    if len(path) == 2:
        # Last: where it computes the same as a value above, the value is the clearer name.
        add(_ABSENT, "what the reference's code falls back to when the key is absent")
    # A sibling: another field of the same kind (`num_key_value_heads` for `num_attention_heads`,
    # `head_dim` for `query_pre_attn_scalar`), read by the reference too.
    for other in reads.values():
        if other.path == path or len(other.path) != 1 or not _numeric(other.value):
            continue
        if type(other.value) is not type(value):
            continue
        if _siblings(name, other.path[0]):
            add(other.value, f"the value of `{other.path[0]}`")
    heads = reads.get(("num_attention_heads",))
    hidden = reads.get(("hidden_size",))
    if (isinstance(value, int) and heads is not None and hidden is not None
            and isinstance(heads.value, int) and heads.value and ("dim" in words or "scalar" in words)):
        add(hidden.value // heads.value, "hidden_size / num_attention_heads")
    return out


def _switch_for(config_class, given, name, raw):
    """The switch (a boolean field, and its value) under which the configuration sets aside the
    value `raw` given for `name` (`use_sliding_window` False for `sliding_window`), or None."""
    try:
        config = config_class(**given)
    except Exception:
        return None
    for field in sorted(_field_names(config)):
        current = getattr(config, field, None)
        if not isinstance(current, bool) or _ignored(field):
            continue
        try:
            flipped = config_class(**{**given, field: not current})
        except Exception:
            continue
        if getattr(flipped, name, None) == raw:
            return field, current
    return None


def _siblings(a: str, b: str) -> bool:
    """Fields of the same kind: sharing their last word (`*_heads`, `*_eps`, `*_size`), or a
    scale's scalar and a head's size."""
    wa, wb = _words(a), _words(b)
    if wa[-1] == wb[-1] and wa[-1] not in ("layers", "embeddings", "id"):
        return True
    pair = {a, b}
    return pair == {"query_pre_attn_scalar", "head_dim"}


def _feature_words(kinds) -> set:
    """The words that name what a per-layer list selects (`sliding` of 'sliding_attention')."""
    generic = {"attention", "full", "layer", "layers", "type", "types", "block"}
    return {w for kind in kinds for w in str(kind).split("_")} - generic


def changes(reads: Reads, config_class, given=None, limit: int = 400) -> list:
    """Every configuration mistake to try: one value changed for each field the reference read;
    then a per-layer feature ported as one thing on every layer (`layer_types` all
    'sliding_attention'), together with how the port reads the fields of that feature (a switch
    that turns it on, its size one more or less): a port that windows every layer with its own
    reading of the window, where the configuration windows some (or, with `use_sliding_window:
    false`, none)."""
    fields = reads.fields
    weights = {}
    for read in fields.values():
        for place in read.places:
            file = place.rpartition(":")[0]
            weights[file] = weights.get(file, 0) + 1
    out = []
    for read in fields.values():
        for value, why in alternatives(read, config_class, fields, given):
            out.append(Change([(read.path, value)], [why], [read], weights))
    per_layer = [r for r in fields.values() if len(r.path) == 1 and isinstance(r.value, list)
                 and (r.path[0] in _PER_LAYER_WORDS or r.path[0].endswith("_types"))]
    for layers in per_layer:
        for kinds, layer_why in alternatives(layers, config_class, fields, given):
            words = _feature_words(kinds)
            # The feature's fields, read or not: a layer reads its window only where it has one.
            group = [r for r in fields.values() if r is not layers and len(r.path) == 1
                     and words & set(_words(r.path[0]))]
            if reads.config is not None:
                named = {r.path[0] for r in group} | {layers.path[0]}
                for name in sorted(_field_names(reads.config)):
                    if name not in named and not _ignored(name) and words & set(_words(name)):
                        group.append(Read((name,), reads.config.__dict__.get(name)))
            # Every combination of one reading (or none) per field of the feature's group.
            combos = [[]]
            for read in group:
                options = [(read, v, why) for v, why in alternatives(read, config_class, fields, given)
                           if not (v is None or v is _ABSENT)]
                combos = [c + [o] for c in combos for o in [None, *options]][:64]
            for combo in combos:
                chosen = [o for o in combo if o is not None]
                if not chosen:
                    continue
                values = [(r.path, v) for r, v, _ in chosen] + [(layers.path, kinds)]
                whys = [w for _, _, w in chosen] + [layer_why]
                out.append(Change(values, whys, [r for r, _, _ in chosen] + [layers], weights))
    return out[:limit]


__all__ = ["Reads", "Change", "changes", "alternatives"]
