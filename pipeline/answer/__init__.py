"""A question to an answer: the conversation engine, query planning, retrieval, the context budget, prompts,
LLM and extractive answers, citations."""
