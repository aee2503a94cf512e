"""Static files with DEBUG off: content-hashed names, compressed, served by WhiteNoise forever.

The chat page's script is ES modules (static/chat/page/); each `import ... from "./x.js"` is
rewritten to the hashed name too, so a cached module never meets a newer one it imports.
"""

from whitenoise.storage import CompressedManifestStaticFilesStorage


class StaticFilesStorage(CompressedManifestStaticFilesStorage):
    support_js_module_import_aggregation = True
