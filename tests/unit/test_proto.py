"""proto/ must be exactly what the contracts generate (`make proto` regenerates it)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from suzumio.contracts.proto import documents

PROTO = Path(__file__).resolve().parents[2] / "proto"


def test_proto_matches_the_contracts() -> None:
    wanted = documents()
    on_disk = {p.relative_to(PROTO).as_posix(): p.read_text() for p in PROTO.rglob("*.json")}
    missing = sorted(set(wanted) - set(on_disk))
    stale = sorted(set(on_disk) - set(wanted))
    changed = sorted(k for k in set(wanted) & set(on_disk) if wanted[k] != on_disk[k])
    drift = {"missing": missing, "stale": stale, "changed": changed}
    assert drift == {"missing": [], "stale": [], "changed": []}, "run `make proto`"


def test_golden_events_validate_against_the_published_schema() -> None:
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "events"
    registry_base = PROTO / "schemas"
    envelope = json.loads((registry_base / "envelope.json").read_text())
    golden = sorted(fixtures.glob("*/v*.json"))
    assert golden, f"no golden event in {fixtures}"
    unchecked = []
    for path in golden:
        doc = json.loads(path.read_text())
        jsonschema.validate(doc, envelope)
        current = registry_base / "events" / f"{path.parent.name}.{path.stem}.json"
        if current.exists():
            jsonschema.validate(doc["data"], json.loads(current.read_text()))
        else:
            unchecked.append(path)
    # Only an older version's data may go unchecked: its type publishes a later schema.
    for path in unchecked:
        later = registry_base.joinpath("events").glob(f"{path.parent.name}.v*.json")
        assert any(int(p.stem.rsplit(".v", 1)[1]) > int(path.stem[1:]) for p in later), path


def test_asyncapi_names_every_channel() -> None:
    doc = json.loads((PROTO / "asyncapi.json").read_text())
    addresses = {c["address"] for c in doc["channels"].values()}
    assert addresses == {
        "ev.{aggregate}.{aggregate_id}",
        "live.session.{session_id}",
        "act.{pool}",
        "cmd.{service}.{verb}",
    }
