from suzumio.platform.service import run_service
from suzumio.scheduler.bootstrap import setup
from suzumio.scheduler.settings import SchedulerSettings

if __name__ == "__main__":
    run_service("scheduler", SchedulerSettings(), setup)
