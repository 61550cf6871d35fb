"""Code-edit tasks for the real-model benchmarks: a small source file and an instruction each.

A task is sent as a chat request ("<instruction> Reply with the whole file only." + the file in a
fence); its prediction is the original file, as an editor plugin would send it.
"""

from __future__ import annotations

SOURCES = {
    "geometry": '''def area(width, height):
    return width * height


def perimeter(width, height):
    return 2 * (width + height)


def describe(width, height):
    return f"{width}x{height}: area {area(width, height)}"
''',
    "stack": '''class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        return self.items.pop()

    def is_empty(self):
        return len(self.items) == 0
''',
    "stats": '''def mean(values):
    return sum(values) / len(values)


def variance(values):
    m = mean(values)
    return sum((v - m) ** 2 for v in values) / len(values)


def stdev(values):
    return variance(values) ** 0.5
''',
    "files": '''import os


def list_python_files(folder):
    result = []
    for name in os.listdir(folder):
        if name.endswith(".py"):
            result.append(os.path.join(folder, name))
    return result


def count_lines(path):
    with open(path) as handle:
        return len(handle.readlines())
''',
    "search": '''def linear_search(items, target):
    for index, item in enumerate(items):
        if item == target:
            return index
    return -1


def binary_search(items, target):
    low, high = 0, len(items) - 1
    while low <= high:
        middle = (low + high) // 2
        if items[middle] == target:
            return middle
        if items[middle] < target:
            low = middle + 1
        else:
            high = middle - 1
    return -1
''',
    "greeting": '''def greet(name):
    print("Hello, " + name + "!")


def farewell(name):
    print("Goodbye, " + name + ".")


def main():
    greet("Ada")
    farewell("Ada")


main()
''',
}

INSTRUCTIONS = {
    "geometry": ["Rename the function area to rectangle_area everywhere.",
                 "Add a docstring to every function.",
                 "Add a parameter unit (default \"cm\") to describe and put it after each number.",
                 "Delete the function perimeter."],
    "stack": ["Add a method peek that returns the top item without removing it.",
              "Rename the class Stack to LifoStack.",
              "Add type hints to every method.",
              "Make pop raise IndexError(\"empty stack\") when the stack is empty."],
    "stats": ["Fix the bug: mean of an empty list should return 0.0.",
              "Rename the parameter values to data everywhere.",
              "Add a docstring to every function.",
              "Reorder the functions so that stdev comes first."],
    "files": ["Use pathlib instead of os.",
              "Add a parameter suffix (default \".py\") to list_python_files.",
              "Delete the function count_lines.",
              "Add type hints to both functions."],
    "search": ["Rename middle to mid everywhere.",
               "Add a docstring to both functions.",
               "Delete the function linear_search.",
               "Reformat the file with two blank lines replaced by one."],
    "greeting": ["Use f-strings instead of string concatenation.",
                 "Add a parameter punctuation to greet.",
                 "Guard the call to main with if __name__ == \"__main__\":.",
                 "Rename farewell to goodbye everywhere."],
}


def edit_message(instruction: str, source: str) -> str:
    """The chat message of an edit task: the instruction, then the whole file in a fence."""
    return f"{instruction} Reply with the whole file only.\n\n```python\n{source}```"


def tasks() -> list[tuple[str, str, str]]:
    """(name, user message, prediction) for every task: 24 in all."""
    out = []
    for source_name, source in SOURCES.items():
        for i, instruction in enumerate(INSTRUCTIONS[source_name]):
            out.append((f"{source_name}.{i}", edit_message(instruction, source), source))
    return out


def history_tasks(count: int, min_bytes: int, max_bytes: int, rev: str = "HEAD",
                  max_instruction_chars: int = 240) -> list[tuple[str, str, str]]:
    """(name, user message, prediction) for single-file ``.py`` edits of this repository's history, read
    with git at run time (nothing copied into the repository): the before-file is the prediction and sits
    in the message; the instruction is the commit's subject (cut at ``max_instruction_chars``), naming the
    file. Names are ``<commit>:<path>``, so a run can be repeated on the same edits with ``rev``."""
    from bench_predict_replay import git, history_edits

    out = []
    for edit in history_edits(count, min_bytes, max_bytes, min_similarity=0.5, rev=rev):
        subject = " ".join(git("log", "-1", "--format=%s", edit.commit).split())
        if len(subject) > max_instruction_chars:
            subject = subject[:max_instruction_chars].rsplit(" ", 1)[0] + " …"
        instruction = f"Edit {edit.path}: {subject}."
        out.append((f"{edit.commit}:{edit.path}", edit_message(instruction, edit.before), edit.before))
    return out
