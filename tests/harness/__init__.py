"""Test harness: a real OpenSSH sshd on loopback (sshd.py) and real faults (faults.py).

See README.md in this folder for the contract.
"""
