"""Text, JSON and Markdown views of plans, results, reports and diffs."""
