"""The feature rows own their features: every row states its seams and tags, its checks read only its own fields,
conflicts follow from the tags, and no predicate on a grpo_hub field is written twice in the package."""

import ast
import inspect
from collections import Counter
from pathlib import Path

import grpo_hub
from grpo_hub.config import conflicts, features
from grpo_hub.config.hub_config import GRPOHubConfig

PACKAGE = Path(grpo_hub.__file__).parent
OWN_FIELDS = set(inspect.get_annotations(GRPOHubConfig))  # the fields grpo_hub adds or redeclares


def test_every_row_names_a_real_field_its_seams_and_known_tags():
    for f in features.FEATURES:
        assert hasattr(GRPOHubConfig("/tmp/x", use_cpu=True), f.field), f.name
        assert f.seams and set(f.seams) <= set(features.SEAMS), f.name
        assert set(f.tags) <= set(features.TAGS), f.name
        assert all(isinstance(words, str) and words for words in f.tags.values()), f.name


def test_every_switch_touches_what_its_tags_say():
    """A row that edits rewards or advantages must say so by a tag, or conflicts with it cannot be derived."""
    for f in features.FEATURES:
        if (
            features.REWARDS in f.seams
            and features.ADVANTAGES not in f.seams
            and f.field.startswith("reward")
        ):
            assert features.EDITS_REWARDS in f.tags, f.name
        if f.seams == (features.REWARDS, features.ADVANTAGES):
            assert {features.EDITS_ADVANTAGES, features.BUILDS_ADVANTAGES} & set(f.tags), f.name


def test_a_new_reward_transform_row_conflicts_with_per_turn_rewards_without_another_edit(monkeypatch):
    row = features.Feature(
        "reward_scale_new",
        "reward_clip",
        lambda c: True,
        {"reward_clip": 2.0},
        (features.REWARDS,),
        {features.EDITS_REWARDS: "the new transform"},
    )
    monkeypatch.setattr(features, "FEATURES", (*features.FEATURES, row))
    derived = [c for rule in conflicts.RULES for c in conflicts.derived(rule)]
    assert any(c.first == "turn_advantages" and "the new transform" in c.problem for c in derived)


def field_reads(node: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and n.attr in OWN_FIELDS}


def test_each_feature_check_reads_only_its_own_fields():
    """A row's checks read its own field, its dependents and the fields they are bounded by, never another row's
    switch field."""
    switch_fields = {f.field for f in features.FEATURES}
    for f in features.FEATURES:
        own = {f.field} | {name for d in f.dependents for name in d.fields}
        for check in f.checks:
            read = field_reads(ast.parse(inspect.getsource(check)))
            foreign = (read & switch_fields) - own - {"loss_type"}  # the loss type bounds every loss check
            assert not foreign, (f.name, check.__name__, foreign)


def canonical_predicates(path: Path) -> list[str]:
    """Comparisons of a grpo_hub field, with whatever holds the config (c, args, self.args) written as `c`: once
    per function (it may test its own predicate twice), each time elsewhere (table rows, lambdas)."""
    found = []
    for statement in ast.parse(path.read_text()).body:
        within = [
            ast.unparse(node).replace(ast.unparse(node.left.value) + ".", "c.", 1)
            for node in ast.walk(statement)
            if isinstance(node, ast.Compare)
            and isinstance(node.left, ast.Attribute)
            and node.left.attr in OWN_FIELDS
            and len(node.ops) == 1
        ]
        found += sorted(set(within)) if isinstance(statement, ast.FunctionDef) else within
    return found


def test_no_predicate_on_a_grpo_hub_field_is_written_twice():
    counts = Counter(p for path in sorted(PACKAGE.rglob("*.py")) for p in canonical_predicates(path))
    assert counts, "the scan found no predicate at all"
    twice = {predicate: n for predicate, n in counts.items() if n > 1}
    assert not twice, twice
