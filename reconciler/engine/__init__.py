"""The executor: runs a Plan's steps through the ports and reports what it did.
It decides nothing the plan has not decided."""
