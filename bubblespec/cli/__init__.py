"""Command-line entry points (`bubblespec <command>`)."""
