"""What is kept, always scoped to its owner: answers, the completion cache and its review records,
policies, conversations, API keys, and their erasure."""
