"""The pytest integration suite: it starts the real pageserver binary and talks HTTP to it.
Fixtures live in fixtures/ (see fixtures/plugin.py); tests in regress/ and performance/."""

pytest_plugins = ["fixtures.plugin"]
