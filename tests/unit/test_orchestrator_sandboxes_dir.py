"""Where the orchestrator keeps its sandboxes: resolved once (every activation asks), yet always
the directory the settings name now, symbolic links followed."""

from __future__ import annotations

from pathlib import Path

from suzumio.orchestrator.settings import OrchestratorSettings


def test_the_sandboxes_directory_follows_links_and_the_settings_it_was_resolved_for(
    tmp_path: Path,
) -> None:
    tmp_path = tmp_path.resolve()  # the expectations are real paths
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    settings = OrchestratorSettings(data_dir=tmp_path / "data", work_dir=tmp_path / "link")
    assert settings.sandboxes() == real
    assert settings.activation_dir("a1") == real / "activations" / "a1"

    settings.work_dir = tmp_path / "other"
    assert settings.sandboxes() == tmp_path / "other"

    settings.work_dir = None
    assert settings.sandboxes() == tmp_path / "data" / "sandboxes"
    settings.data_dir = tmp_path / "elsewhere"
    elsewhere = tmp_path / "elsewhere" / "sandboxes"
    assert settings.activation_dir("a2") == elsewhere / "activations" / "a2"

    copied = settings.model_copy(update={"work_dir": real})
    assert copied.sandboxes() == real
    assert settings.sandboxes() == elsewhere
