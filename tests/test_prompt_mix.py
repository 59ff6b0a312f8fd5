"""specdec_lib.train.prompt_mix: families, sizes, determinism, splits, chat shape (CPU, fast)."""
import collections

import pytest

from specdec_lib.train import prompt_mix as pm


def _key(item):
    return tuple((m["role"], m["content"]) for m in item["messages"])


def _valid_chat(msgs):
    roles = [m["role"] for m in msgs]
    if roles and roles[0] == "system":
        roles = roles[1:]
    assert roles and roles[-1] == "user", roles
    assert all(r == ("user" if j % 2 == 0 else "assistant") for j, r in enumerate(roles)), roles
    assert all(isinstance(m["content"], str) and m["content"].strip() for m in msgs)


def test_families_and_heldout():
    assert len(pm.FAMILIES) >= 10 and len(set(pm.FAMILIES)) == len(pm.FAMILIES)
    assert len(pm.HELDOUT_FAMILIES) == 2 and set(pm.HELDOUT_FAMILIES) <= set(pm.FAMILIES)
    assert all(pm.family_size(f) >= 500 for f in pm.FAMILIES)


def test_counts_per_family_balanced():
    items = pm.prompt_mix(1100, seed=3)
    assert len(items) == 1100
    counts = collections.Counter(it["family"] for it in items)
    assert set(counts) == set(pm.FAMILIES)
    assert max(counts.values()) - min(counts.values()) <= 1
    # a family smaller than its share gives all it has, the others make up the rest
    big = pm.prompt_mix(8000, families=["advice", "creative"])
    c = collections.Counter(it["family"] for it in big)
    assert c["advice"] == pm.family_size("advice") and sum(c.values()) == 8000


def test_at_least_30k_distinct():
    assert sum(pm.family_size(f) for f in pm.FAMILIES) >= 30000
    items = pm.prompt_mix(33000, seed=0)
    assert len({_key(it) for it in items}) >= 30000
    train, _ = pm.split(items)
    assert len({_key(it) for it in train}) >= 20000


def test_deterministic_and_seeded():
    a, b = pm.prompt_mix(300, seed=7), pm.prompt_mix(300, seed=7)
    assert a == b
    assert a != pm.prompt_mix(300, seed=8)
    # the template families do not depend on the Python version: spot-check fixed items
    assert pm.prompt_mix(1, families=["translation"], seed=0) == \
        pm.prompt_mix(1, families=["translation"], seed=0)
    assert pm._question(0)[0]["content"] == "What is the most interesting thing about black holes?"


def test_split_keeps_heldout_out_of_train():
    train, held = pm.split(pm.prompt_mix(2000, seed=1))
    assert train and held and len(train) + len(held) == 2000
    assert not {it["family"] for it in train} & set(pm.HELDOUT_FAMILIES)
    assert {it["family"] for it in held} == set(pm.HELDOUT_FAMILIES)


def test_every_item_a_valid_chat():
    items = pm.prompt_mix(5000, seed=2)
    for it in items:
        _valid_chat(it["messages"])
    chats = [it for it in items if it["family"] == "chat"]
    assert any(it["messages"][0]["role"] == "system" for it in chats)
    assert all(len(it["messages"]) >= 3 for it in chats)


def test_code_languages_and_families_argument():
    text = " ".join(it["messages"][-1]["content"]
                    for it in pm.prompt_mix(None, families=["code"]))
    for lang in ("Python", "JavaScript", "SQL", "bash", " C ", "Rust", "Go"):
        assert lang in text
    with pytest.raises(ValueError):
        pm.prompt_mix(10, families=["nope"])
