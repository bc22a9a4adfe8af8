"""OpenAI-compatible HTTP server over the engine (`radixflow serve`): see docs/server.md."""

from radixflow.server.app import ServerConfig, create_app

__all__ = ["ServerConfig", "create_app"]
