"""Microsoft Teams adapter: the Bot Framework protocol (signed activities in, Connector REST out) on the
platform-neutral conversation core. See docs/teams.md for why it speaks the protocol directly."""
