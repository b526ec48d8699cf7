import psutil
from st2common.runners.base_action import Action


class LoadAverageAction(Action):
    def run(self):
        one, five, fifteen = psutil.getloadavg()
        return {
            "load1": one,
            "load5": five,
            "load15": fifteen,
            "cpus": psutil.cpu_count(),
        }
