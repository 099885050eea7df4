"""Slack: Bolt listeners, Block Kit / mrkdwn rendering, Socket Mode and HTTP transports."""
