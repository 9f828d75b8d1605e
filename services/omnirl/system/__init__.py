"""This machine's processes and files, below every other package: child processes that run no Python between
fork and exec (`child.py`: the embedded Redis, the role processes, the judge servers) and storage faults and durable
writes (`disk.py`: ENOSPC and its kin told apart, the fsyncs, the weights files' mode). Imports nothing of ours."""
