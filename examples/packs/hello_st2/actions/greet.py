from st2common.runners.base_action import Action

from lib.greeting import make_greeting


class GreetAction(Action):
    def run(self, name):
        word = (self.config or {}).get("greeting", "Hello")
        return make_greeting(word, name)
