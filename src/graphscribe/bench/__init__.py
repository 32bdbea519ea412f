"""`transcribe bench`: the decode benchmark (decode.py), the folder throughput (folder.py), the command (command.py)."""
