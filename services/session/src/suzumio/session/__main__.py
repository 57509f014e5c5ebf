from suzumio.platform.service import run_service
from suzumio.session.bootstrap import setup
from suzumio.session.settings import SessionSettings

if __name__ == "__main__":
    run_service("session", SessionSettings(), setup)
