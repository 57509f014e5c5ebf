from suzumio.gateway.bootstrap import setup
from suzumio.gateway.settings import GatewaySettings
from suzumio.platform.service import run_service

if __name__ == "__main__":
    run_service("gateway", GatewaySettings(), setup)
