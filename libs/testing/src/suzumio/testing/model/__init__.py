"""The scripted OpenAI-compatible model server and the offline demo model, in parts.

Import the public names from `suzumio.testing.model_server`.
"""
