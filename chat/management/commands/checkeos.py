"""`manage.py checkeos`: does the model stop where its chat template ends a turn?"""

from django.core.management.base import BaseCommand, CommandError

from chat.engine.text.eos import load_eos_report
from chat.infra.checks import model_dir


class Command(BaseCommand):
    help = (
        "Print the tokenizer's eos, the generation config's eos ids and the template's end marker."
    )

    def handle(self, *args, **options):
        folder = model_dir()
        if folder is None:
            raise CommandError(
                "the model is not converted yet: run `make run` or `python -m chat.engine.weights.convert`"
            )
        report = load_eos_report(folder)
        self.stdout.write(f"model folder:                {folder}")
        self.stdout.write(
            f"tokenizer eos token:         {report.tokenizer_eos!r} (id {report.tokenizer_eos_id})"
        )
        self.stdout.write(f"generation_config eos ids:   {report.generation_eos_ids}")
        self.stdout.write(
            f"chat template end marker:    {report.template_end_marker!r} (id {report.template_end_marker_id})"
        )
        if report.agree:
            self.stdout.write(
                self.style.SUCCESS(
                    "OK: they agree; generation stops where the template ends a turn"
                )
            )
            return
        for problem in report.problems:
            self.stdout.write(self.style.WARNING(f"MISMATCH: {problem}"))
        raise CommandError("eos configuration disagrees; the model may ramble past its answer")
