"""Code shared by the pack's actions (reached through actions/lib)."""


def make_greeting(word, name):
    return "{}, {}!".format(word, name.strip() or "stranger")
