"""Jobs: submit, list, show, cancel, and what a job's page and summary read."""
