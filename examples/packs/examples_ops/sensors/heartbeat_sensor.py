from st2reactor.sensor.base import PollingSensor


class HeartbeatSensor(PollingSensor):
    def setup(self):
        self._count = 0

    def poll(self):
        self._count += 1
        self.sensor_service.dispatch(
            trigger="examples_ops.heartbeat", payload={"count": self._count}
        )

    def cleanup(self):
        pass

    def add_trigger(self, trigger):
        pass

    def update_trigger(self, trigger):
        pass

    def remove_trigger(self, trigger):
        pass
