"""The platform-neutral conversation core: what evident does with a question, a reaction or a command,
whatever chat platform it came from. Platform adapters (``bot.slack``, later Teams) import it; it imports
no adapter."""
