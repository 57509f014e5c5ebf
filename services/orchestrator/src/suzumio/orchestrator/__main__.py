from suzumio.orchestrator.bootstrap import setup
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.platform.service import run_service

if __name__ == "__main__":
    run_service("orchestrator", OrchestratorSettings(), setup)
