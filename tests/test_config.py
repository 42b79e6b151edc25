"""The config mechanism both trainers share: defaults, TOML, CLI overrides, clear errors."""
import dataclasses
import typing

import pytest

from training.config import ConfigError, from_dict, help_text, load_config, result_changes, to_dict


@dataclasses.dataclass
class Inner:
    act: str = "gelu"
    act_kwargs: dict = dataclasses.field(default_factory=dict)
    n_layer: int = 12


@dataclasses.dataclass
class Outer:
    model: Inner = dataclasses.field(default_factory=Inner)
    max_lr: float = 6e-4
    betas: tuple[float, float] = (0.9, 0.95)
    compile: typing.Optional[bool] = None
    shuffle: bool = True


def test_defaults_file_and_cli_in_that_order(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('max_lr = 1e-3\n[model]\nact = "relu"\nn_layer = 4\n[model.act_kwargs]\nkappa_init = [1.0, 1.3]\n')
    cfg = load_config(Outer, ["--config", str(f), "--act", "aglu", "--model.n_layer=6", "--betas", "0.8,0.9"])
    assert cfg.model.act == "aglu" and cfg.model.n_layer == 6 and cfg.max_lr == 1e-3
    assert cfg.model.act_kwargs == {"kappa_init": [1.0, 1.3]} and cfg.betas == (0.8, 0.9)


def test_bool_flags_and_optional_bool():
    assert load_config(Outer, ["--compile"]).compile is True
    assert load_config(Outer, ["--no-compile"]).compile is False
    assert load_config(Outer, ["--compile", "none"]).compile is None
    assert load_config(Outer, ["--no-shuffle", "--max-lr", "2e-4"]).shuffle is False


def test_ints_accept_scientific_notation_but_not_fractions():
    assert load_config(Outer, ["--n-layer", "1e1"]).model.n_layer == 10
    with pytest.raises(ConfigError, match="n_layer"):
        load_config(Outer, ["--n-layer", "2.5"])


def test_dict_from_json_on_the_command_line():
    cfg = load_config(Outer, ["--act-kwargs", '{"lam_init": 0.5}'])
    assert cfg.model.act_kwargs == {"lam_init": 0.5}
    with pytest.raises(ConfigError, match="JSON object"):
        load_config(Outer, ["--act-kwargs", "lam_init=0.5"])


def test_unknown_keys_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="did you mean max_lr"):
        load_config(Outer, ["--max-lrr", "1"])
    f = tmp_path / "bad.toml"
    f.write_text("[model]\nn_layers = 3\n")
    with pytest.raises(ConfigError, match=r"n_layers.*bad\.toml.*n_layer"):
        load_config(Outer, ["--config", str(f)])
    with pytest.raises(ConfigError, match="not found"):
        load_config(Outer, ["--config", str(tmp_path / "missing.toml")])


def test_round_trip_through_dict():
    cfg = load_config(Outer, ["--act", "nswish", "--betas", "0.1,0.2"])
    assert from_dict(Outer, to_dict(cfg)) == cfg


def test_shipped_configs_load():
    import train_gpt2
    for name in ("gpt2_124m", "gpt2_cpu_tiny"):
        cfg = load_config(train_gpt2.TrainConfig, ["--config", f"configs/{name}.toml"])
        assert cfg.model.vocab_size == 50304
    anchor = load_config(train_gpt2.TrainConfig, ["--config", "configs/gpt2_124m.toml"])
    assert anchor.optim.total_batch_size == 2**19 and anchor.optim.max_steps == 19073
    assert train_gpt2.steps_per_rank(2**19, 64, 1024, 8) == 1


def test_the_byte_config_is_the_tiny_one_on_bytes():
    """configs/gpt2_cpu_bytes.toml: the same model and schedule as configs/gpt2_cpu_tiny.toml, so that their
    speeds and bits per byte compare."""
    import train_gpt2
    tiny, byte = (to_dict(load_config(train_gpt2.TrainConfig, ["--config", f"configs/gpt2_cpu_{name}.toml"]))
                  for name in ("tiny", "bytes"))
    differ = {(section, key) for section, table in tiny.items() if isinstance(table, dict)
              for key, value in table.items() if byte[section][key] != value}
    assert differ == {("model", "vocab_size"), ("data", "data_dir"), ("run", "out_dir")}
    assert byte["model"]["vocab_size"] == 256


def test_shipped_translation_configs_load_and_build():
    import train_translation
    from translation.model import Transformer
    for name in ("translation_6l", "translation_12l", "translation_cpu_small", "translation_small_data"):
        cfg = load_config(train_translation.TrainConfig, ["--config", f"configs/{name}.toml"])
        Transformer.check_config(cfg.model)
    for name, sentences in (("translation_6l", 256), ("translation_12l", 128)):  # ANAct Tables 10 and 9
        data = load_config(train_translation.TrainConfig, ["--config", f"configs/{name}.toml"]).data
        assert data.max_sentences * data.total_max_tokens // data.max_tokens == sentences  # per optimizer step
        assert [train_translation.accumulation(data, n) for n in (1, 2, 4)] == [4, 2, 1]  # the same step on 1-4 GPUs
    small = load_config(train_translation.TrainConfig, ["--config", "configs/translation_small_data.toml"])
    assert (small.model.tie_output, small.model.dropout, small.optim.warmup_steps) == (False, 0.1, 1000)


@dataclasses.dataclass
class Documented(Inner):
    # the learning rate at the top of the schedule,
    # after warmup
    max_lr: float = 6e-4
    n_layer: int = 4  # transformer blocks ("#" in a comment is fine)
    seed: int = 1


def test_help_shows_each_options_default_and_comment():
    """--help: the comment after a field, else the comment lines above it; a subclass's field wins."""
    lines = {line.split()[0]: line for line in help_text(Documented).splitlines()}
    assert lines["--max-lr"].split(None, 2)[1:] == ["0.0006", "the learning rate at the top of the schedule, after warmup"]
    assert lines["--n-layer"].split(None, 2)[1:] == ["4", 'transformer blocks ("#" in a comment is fine)']
    assert lines["--seed"].split() == ["--seed", "1"] and lines["--act"].split() == ["--act", "'gelu'"]


def test_sample_interval_help_says_when_samples_come():
    import train_gpt2

    line = next(line for line in help_text(train_gpt2.TrainConfig).splitlines() if "--sample-interval" in line)
    assert "every N steps, between evaluations too" in line


def _sections(cls):
    yield cls
    for f in dataclasses.fields(cls):
        hint = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(hint):
            yield from _sections(hint)


@pytest.mark.parametrize("trainer", ["train_gpt2", "train_translation"])
def test_a_resume_may_change_only_what_its_section_lists(trainer):
    """What --resume compares (training/checkpoint.py): every option but those listed in resume_may_change, which
    name real options; an option the checkpoint predates compares at its default."""
    import importlib

    cls = importlib.import_module(trainer).TrainConfig
    for section in _sections(cls):
        assert set(getattr(section, "resume_may_change", ())) <= {f.name for f in dataclasses.fields(section)}
    stored = to_dict(cls())
    neutral = ["--out-dir", "elsewhere", "--compile", "true", "--eval-interval", "7", "--dist-timeout", "30",
               "--log-interval", "3", "--checkpoint-interval", "9", "--act", "relu", "--resume-changes", "seed"]
    assert result_changes(load_config(cls, neutral), stored) == {}
    cfg = load_config(cls, neutral + ["--seed", "2", "--grad-clip", "0.5", "--dtype", "float32"])
    clip = stored["optim"]["grad_clip"]
    assert result_changes(cfg, stored) == {"run.seed": (1337, 2), "optim.grad_clip": (clip, 0.5),
                                           "run.dtype": ("auto", "float32")}
    del stored["optim"]["grad_clip"]  # a checkpoint from before the option: it ran at the default
    assert "optim.grad_clip" in result_changes(cfg, stored)
    assert "optim.grad_clip" not in result_changes(load_config(cls, ["--seed", "2"]), stored)
