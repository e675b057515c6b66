"""Ref names and revisions: a name never hijacks an id, full ref forms, no trimming (issue 12, #8)."""
from __future__ import annotations


import pytest
from cli_helpers import run
import torch

from mvc.repo.refs import AmbiguousRefNameError, RefNameError, check_ref_name
from mvc.repo.repository import Repo
from mvc.repo.revparse import UnknownRevisionError
from mvc.store import RefUpdate

HEADS, TAGS = "refs/heads/", "refs/tags/"



def _legacy_ref(repo: Repo, ref: str, oid: str) -> None:
    """A ref written before names were checked (or by another tool): straight into the store."""
    repo.store.refs.update_refs([RefUpdate(ref, None, oid)], "test: legacy ref")


@pytest.fixture
def two(repo):
    """main at A ({"w": zeros}), branch exp at B ({"w": ones}); HEAD on main."""
    a = repo.commit({"w": torch.zeros(4)}, "A")
    repo.branch("exp")
    repo.switch("exp")
    b = repo.commit({"w": torch.ones(4)}, "B")
    repo.switch("main")
    return repo, a, b


# ------------------------------------------------------------------ ids win over names
def test_tag_named_like_a_full_id_does_not_hijack_reads_of_that_commit(two):
    repo, a, b = two
    _legacy_ref(repo, TAGS + a, b)
    _legacy_ref(repo, HEADS + a, b)
    assert repo.resolve(a) == a
    assert torch.equal(repo.read_state(a)["w"], torch.zeros(4))
    assert torch.equal(repo.checkout(a)["w"], torch.zeros(4))
    assert repo.head() == a and repo.current_branch() is None
    # The legacy refs stay reachable through their full names.
    assert repo.resolve(TAGS + a) == b and repo.resolve(HEADS + a) == b


def test_checkout_branch_resolves_once_despite_a_tag_named_like_its_id(two):
    repo, a, b = two
    repo.switch("exp")
    _legacy_ref(repo, TAGS + a, b)  # a tag named like main's commit, pointing elsewhere
    state = repo.checkout("main")
    assert torch.equal(state["w"], torch.zeros(4))
    assert repo.current_branch() == "main" and repo.head() == a


def test_cli_checkout_main_writes_mains_checkpoint_and_attaches(two, tmp_path):
    repo, a, b = two
    repo.switch("exp")
    _legacy_ref(repo, TAGS + a, b)
    # Without -o (checkout -o writes a copy and never moves HEAD, docs/cli.md).
    repo.config.set("checkpoint.path", str(tmp_path / "out.pt"))
    code, out, err = run(repo.path, "checkout", "main")
    assert code == 0, err
    assert "on branch main" in out
    assert torch.equal(torch.load(tmp_path / "out.pt")["w"], torch.zeros(4))
    assert repo.current_branch() == "main"


def test_short_hex_legacy_name_still_resolves_as_a_name(two):
    repo, a, b = two
    _legacy_ref(repo, TAGS + a[:8], b)  # like git: a name wins over an id prefix
    assert repo.resolve(a[:8]) == b
    assert repo.resolve(a) == a


# ------------------------------------------------------------------ names refused at creation
@pytest.mark.parametrize("kind", ["tag", "branch"])
def test_id_like_names_are_refused(two, kind):
    repo, a, _b = two
    create = repo.tag if kind == "tag" else repo.branch
    for name in (a, a[:8], a[:4], a.upper(), "beef", "2024", "0" * 40):
        with pytest.raises(AmbiguousRefNameError):
            create(name, "exp")
    assert repo.tags() == [] and [n for n, _ in repo.branches()] == ["exp", "main"]
    assert repo.resolve(a) == a


def test_cli_refuses_id_like_tag_with_one_line_and_own_exit_code(two):
    repo, a, _b = two
    code, _out, err = run(repo.path, "tag", a, "exp")
    assert code == AmbiguousRefNameError.exit_code
    assert len(err.strip().splitlines()) == 1 and "commit id" in err
    assert repo.tags() == []
    assert len({AmbiguousRefNameError.exit_code, RefNameError.exit_code}) == 2


@pytest.mark.parametrize("name", [
    "refs/heads/main", "refs/tags/v1", "refs/x", "HEAD", "@", "a..b", "-x", "a@{1}", "a b",
    "a\tb", "x.lock", "a.lock/b", "x/", "a//b", "/a", "a/.b", ".a", "a.", "a~1", "a^", "a:b",
    "a?", "a*", "a[b", "a\\b", "\x1b[31mred", "a\x7fb", "a\x9bb", "", "a/",
])
def test_names_git_refuses_are_refused(name):
    with pytest.raises(RefNameError):
        check_ref_name(name, "branch")


@pytest.mark.parametrize("name", [
    "main", "v1", "feature/x", "dead-beef", "cafe1x", "abc", "x.y", "release-2024", "résumé",
    "a@b", "g1234", "exp/lr=3e-4",
])
def test_ordinary_names_are_accepted(name):
    check_ref_name(name, "branch")


def test_refs_prefixed_branch_name_refused(two):
    repo, _, _ = two
    with pytest.raises(RefNameError):
        repo.branch("refs/heads/main", "exp")
    with pytest.raises(RefNameError):
        repo.switch("refs/heads/x", create=True)


# ------------------------------------------------------------------ full ref forms
def test_checkout_full_branch_ref_attaches_to_that_branch(two):
    repo, a, b = two
    repo.switch("exp")
    _legacy_ref(repo, HEADS + "refs/heads/main", b)  # a branch literally named refs/heads/main
    state = repo.checkout("refs/heads/main")
    assert torch.equal(state["w"], torch.zeros(4))
    assert repo.current_branch() == "main" and repo.head() == a
    # ... and the legacy branch is reached by its own full name.
    repo.checkout("refs/heads/refs/heads/main")
    assert repo.current_branch() == "refs/heads/main" and repo.head() == b


def test_full_ref_forms_resolve_exactly(two):
    repo, a, b = two
    repo.tag("v1", "exp")
    assert repo.resolve("refs/tags/v1") == b and repo.resolve("refs/heads/exp") == b
    repo.checkout("refs/tags/v1")
    assert repo.current_branch() is None and repo.head() == b
    for rev in ("refs/heads/v1", "refs/tags/exp", "refs/heads/nope", "refs/replace/" + a):
        with pytest.raises(UnknownRevisionError):
            repo.resolve(rev)


def test_cli_checkout_full_ref_attaches(two, tmp_path):
    repo, a, b = two
    _legacy_ref(repo, HEADS + "refs/heads/exp", a)
    # Without -o (checkout -o writes a copy and never moves HEAD, docs/cli.md).
    repo.config.set("checkpoint.path", str(tmp_path / "o.pt"))
    code, out, err = run(repo.path, "checkout", "refs/heads/exp")
    assert code == 0, err
    assert "on branch exp" in out and repo.current_branch() == "exp" and repo.head() == b
    assert torch.equal(torch.load(tmp_path / "o.pt")["w"], torch.ones(4))


def test_switch_accepts_full_branch_ref(two):
    repo, _a, _b = two
    repo.switch("refs/heads/exp")
    assert repo.current_branch() == "exp"


# ------------------------------------------------------------------ no silent trimming
@pytest.mark.parametrize("rev", [" main", "main ", "\tmain", "main\n", " exp~1"])
def test_revision_with_whitespace_is_unknown_with_a_hint(two, rev):
    repo, _a, b = two
    repo.switch("exp")
    with pytest.raises(UnknownRevisionError) as ei:
        repo.checkout(rev)
    assert "whitespace" in str(ei.value) and repr(rev.strip()) in str(ei.value)
    assert repo.current_branch() == "exp" and repo.head() == b


def test_cli_checkout_space_main_refused_head_unchanged(two, tmp_path):
    repo, _a, b = two
    repo.switch("exp")
    code, _out, err = run(repo.path, "checkout", " main", "-o", str(tmp_path / "o.pt"))
    assert code == UnknownRevisionError.exit_code and "whitespace" in err
    assert not (tmp_path / "o.pt").exists()
    assert repo.current_branch() == "exp" and repo.head() == b


def test_revision_with_control_chars_is_unknown_not_a_store_error(two):
    repo, _, _ = two
    for rev in ("ma\x1bin", "a\x00b", "refs/heads/ma\x01in"):
        with pytest.raises(UnknownRevisionError):
            repo.resolve(rev)


# ------------------------------------------------------------------ attach exactly as resolved
def test_checkout_suffix_and_id_detach_but_head_keeps_branch(two):
    repo, a, _b = two
    repo.checkout("main^0")
    assert repo.current_branch() is None and repo.head() == a
    repo.checkout("main")
    repo.checkout("HEAD")  # like git: checking out HEAD keeps the branch
    assert repo.current_branch() == "main"
    repo.checkout(a)
    assert repo.current_branch() is None


def test_tag_shadowed_by_branch_of_same_name_attaches_to_branch(two):
    repo, a, b = two
    _legacy_ref(repo, TAGS + "exp", a)
    repo.checkout("exp")  # the branch wins, and HEAD attaches to what was read
    assert repo.current_branch() == "exp" and repo.head() == b
    repo.checkout("refs/tags/exp")
    assert repo.current_branch() is None and repo.head() == a
