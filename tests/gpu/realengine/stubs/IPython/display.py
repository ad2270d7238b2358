# STUB (real-engine rig): only used by sglang.utils notebook helpers (print_highlight etc.), never on the server path.
class HTML:
    def __init__(self, *a, **k):
        self.data = a[0] if a else ""
def display(*a, **k):
    print(*a)
