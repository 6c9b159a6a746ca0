"""The agent process and its supervision: ``python -m shipyard.daemon`` runs the loop
(``loop``); ``supervisor`` starts one for a home when work is queued and none runs."""
