"""`mvc log --graph`'s lanes (mvc.cli.graph): forks join their parent's lane, merges open
one, children are drawn above parents whatever the commit times say."""
from __future__ import annotations

from dataclasses import dataclass, field

from mvc.cli.graph import children_first, draw


@dataclass
class Node:
    id: str
    parents: list[str] = field(default_factory=list)


def picture(nodes: list[Node]) -> list[str]:
    out = []
    for g in draw(nodes):
        out.append(f"{g.row} {g.commit.id}")
        out += g.after
    return out


def test_a_straight_line_is_one_lane():
    nodes = [Node("c", ["b"]), Node("b", ["a"]), Node("a")]
    assert picture(nodes) == ["* c", "* b", "* a"]


def test_a_fork_joins_the_lane_of_its_parent():
    # main: a-b-c, exp: b-x-y (newest first by time: y, c, x, b, a)
    nodes = [Node("y", ["x"]), Node("c", ["b"]), Node("x", ["b"]), Node("b", ["a"]), Node("a")]
    assert picture(nodes) == [
        "* y",
        "| * c",
        "* | x",
        "|/",
        "* b",
        "* a",
    ]


def test_two_forks_from_one_commit_and_a_merge():
    nodes = [Node("m", ["c", "y"]), Node("y", ["b"]), Node("c", ["b"]), Node("z", ["b"]),
             Node("b", ["a"]), Node("a")]
    assert picture(nodes) == [
        "* m",
        "|\\",        # the merge opens a lane for its second parent
        "| * y",
        "* | c",
        "|/",          # both meet at b
        "| * z",       # a third child of b, listed later
        "|/",
        "* b",
        "* a",
    ]


def test_a_long_branch_keeps_its_lane_until_the_fork_point():
    nodes = [Node("d", ["c"]), Node("z", ["a"]), Node("c", ["b"]), Node("b", ["a"]), Node("a")]
    assert picture(nodes) == ["* d", "| * z", "* | c", "* | b", "|/", "* a"]


def test_children_come_first_even_when_times_disagree():
    # a parent listed before its child (clock skew): the child is moved above it
    nodes = [Node("b", ["a"]), Node("a"), Node("c", ["b"])]
    assert [n.id for n in children_first(nodes)] == ["c", "b", "a"]
    assert picture(nodes) == ["* c", "* b", "* a"]


def test_a_lane_cut_off_by_max_count_runs_to_the_bottom():
    nodes = [Node("y", ["x"]), Node("c", ["b"])]   # -n 2: neither parent shown
    assert picture(nodes) == ["* y", "| * c"]


def test_mvc_log_all_graph_draws_a_forked_experiment(tmp_path):
    import torch
    from cli_helpers import run

    from mvc.repo.repository import Repo

    with Repo.init(tmp_path) as repo:
        ids = [repo.commit({"w": torch.full((3,), float(i))}, f"main {i}") for i in (1, 2)]
        repo.branch("exp")
        ids.append(repo.commit({"w": torch.full((3,), 3.0)}, "main 3"))
    rc, out, _ = run(tmp_path, "switch", "exp")
    assert rc == 0
    with Repo(tmp_path) as repo:
        exp = repo.commit({"w": torch.full((3,), 5.0)}, "exp 1")
    rc, out, err = run(tmp_path, "log", "--all", "--graph", "--oneline")
    assert rc == 0, err
    assert out.splitlines() == [
        f"* {exp[:12]} (HEAD -> exp) exp 1",
        f"| * {ids[2][:12]} (main) main 3",
        "|/",
        f"* {ids[1][:12]} main 2",
        f"* {ids[0][:12]} main 1",
    ]
    rc, out, _ = run(tmp_path, "log", "--all", "--graph")
    lines = out.splitlines()
    assert lines[0].startswith("* commit ") and "| * commit " in out and "|/" in lines
    assert lines[-1] == "      main 1"   # under the root: its lane's column, then the indent
