"""slurm/node_address.py: the head node's address is never loopback, whatever /etc/hosts says."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "slurm" / "node_address.py"


@pytest.fixture()
def node_address(monkeypatch):
    spec = importlib.util.spec_from_file_location("node_address", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _hosts(monkeypatch, module, route: str | None, names: list[str]) -> None:
    monkeypatch.setattr(module, "route_address", lambda probe: route)
    monkeypatch.setattr(module, "name_addresses", lambda: names)


def test_the_route_source_address_comes_first(node_address, monkeypatch):
    _hosts(monkeypatch, node_address, "10.1.0.7", ["10.2.0.7"])
    assert node_address.node_address() == ("10.1.0.7", ["10.1.0.7", "10.2.0.7"])


def test_without_a_route_the_name_counts_but_never_its_loopback_mapping(node_address, monkeypatch):
    """Debian-style /etc/hosts: `127.0.1.1 node1` — what `hostname --ip-address` would have printed."""
    _hosts(monkeypatch, node_address, None, ["127.0.1.1", "10.2.0.7"])
    assert node_address.node_address()[0] == "10.2.0.7"
    _hosts(monkeypatch, node_address, "127.0.0.1", ["127.0.1.1"])
    assert node_address.node_address() == (None, ["127.0.0.1", "127.0.1.1"])


def test_only_loopback_fails_naming_what_it_saw_and_the_way_out(node_address, monkeypatch, capsys):
    _hosts(monkeypatch, node_address, None, ["127.0.1.1"])
    assert node_address.main() == 1
    err = capsys.readouterr().err
    assert "no routable IPv4 address (seen: 127.0.1.1)" in err and "HACPO_HEAD_IP" in err


def test_route_address_asks_the_kernel_without_sending(node_address):
    """A UDP connect only picks the route: to a loopback probe, the source address is loopback."""
    assert node_address.route_address("127.0.0.1:9") == "127.0.0.1"


def test_main_prints_the_routable_address_alone(node_address, monkeypatch, capsys):
    _hosts(monkeypatch, node_address, "127.0.0.1", ["127.0.1.1", "10.2.0.7"])
    assert node_address.main() == 0
    assert capsys.readouterr().out == "10.2.0.7\n"
