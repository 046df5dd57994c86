"""``python -m andon``: the ``andon`` command (a container image need not put it on PATH)."""

from andon.cli import main

if __name__ == "__main__":
    main()
