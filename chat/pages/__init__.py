"""The pages people see: the chat page and the conversation JSON API it calls, the settings and
usage pages, the error pages, and the Content-Security-Policy every response carries."""
