"""Accounts: users, tokens, sign-in, roles (rbac), and the audit log's reading (auditing)."""
