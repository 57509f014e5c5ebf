from suzumio.platform.service import run_service
from suzumio.toolbroker.bootstrap import setup
from suzumio.toolbroker.settings import ToolbrokerSettings

if __name__ == "__main__":
    run_service("toolbroker", ToolbrokerSettings(), setup)
