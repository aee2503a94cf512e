"""`manage.py policyregressions SLUG`: run a stored policy's regression set on the model, keep the
run, and fail (exit status 1) when a case does not come out as expected."""

import asyncio

from django.core.management.base import BaseCommand, CommandError

from chat.infra.engines import EngineSpec
from chat.infra.runtime import runtime
from chat.models import OutputPolicy
from chat.stores.policy_store import compile_policy
from chat.turns import regressions


class Command(BaseCommand):
    help = "Run a policy's regression set (the stored policy) and compare with the last run."

    def add_arguments(self, parser):
        parser.add_argument("slug", help="the policy's slug")

    def handle(self, *args, slug: str, **options):
        policy = OutputPolicy.objects.filter(slug=slug).first()
        if policy is None:
            known = ", ".join(OutputPolicy.objects.values_list("slug", flat=True)) or "none"
            raise CommandError(f"no output policy {slug!r} (known: {known})")
        cases = list(policy.regression_cases.values_list("prompt", "expected"))
        if not cases:
            raise CommandError(f"policy {slug!r} has no regression cases; add them in the admin")
        self.stderr.write("loading the model…")
        runtime.start()
        if not runtime.wait():
            raise CommandError(f"the model failed to load: {runtime.detail}")
        engine = EngineSpec.of(policy.engine) if policy.engine is not None else None
        results = asyncio.run(regressions.regressions_run(compile_policy(policy), cases, engine))
        for result in results:
            mark = "PASS" if result.passed else "FAIL"
            got = ", ".join(result.got) or "—"
            line = f"{mark}  expected {result.expected:<10} got {got:<22} {result.prompt[:60]!r}"
            if result.reason:
                line += f"  ({result.reason[:80]})"
            self.stdout.write(self.style.SUCCESS(line) if result.passed else self.style.ERROR(line))
        run = regressions.run_record(
            policy_id=policy.pk, version=policy.version, draft=False, user_id=None, results=results
        )
        previous = regressions.previous_run(run)
        summary = f"{run.passed} of {run.total} passed ({run.pass_percent})"
        if previous is not None:
            summary += (
                f"; the run before: {previous.passed} of {previous.total} "
                f"({previous.pass_percent}), version {previous.policy_version}"
            )
        self.stdout.write(summary)
        if run.passed < run.total:
            raise CommandError(f"{run.total - run.passed} regression case(s) failed")
