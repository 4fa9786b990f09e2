"""`--config-dir`: a directory of one's own configs, searched before the shipped `conf/` (whose groups it may name)."""

from __future__ import annotations

import shutil

from nemo_hacpo.config import load_config
from nemo_hacpo.config.loading import CONF_DIR


def test_a_config_of_ones_own_names_the_shipped_groups_and_its_own_ones_take_precedence(tmp_path):
    shutil.copy(CONF_DIR / "pair_tiny_gpt.yaml", tmp_path / "mine.yaml")  # `algo: hacpo`, `task: arithmetic`
    assert not (tmp_path / "algo").exists()
    cfg = load_config("mine", ["algo=gspo", "runtime.steps=3"], tmp_path)
    assert (cfg.algo.name, cfg.algo.updates_per_step, cfg.runtime.steps) == ("gspo", 2, 3)
    assert load_config("mine", [], tmp_path).algo.name == "hacpo"

    (tmp_path / "algo").mkdir()  # a group option of the same name in one's own directory comes first
    shipped = (CONF_DIR / "algo" / "hacpo.yaml").read_text()
    assert "\ncapability_window: " in shipped  # a key the pair's own YAML does not set
    (tmp_path / "algo" / "hacpo.yaml").write_text(shipped.replace("\ncapability_window: ", "\ncapability_window: 3 #", 1))
    assert load_config("mine", [], tmp_path).algo.capability_window == 3
    assert load_config("pair_tiny_gpt", []).algo.capability_window != 3  # the shipped directory alone: unchanged
