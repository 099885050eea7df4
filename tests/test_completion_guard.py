"""A follow-up's completion keeps the message's own words (any English or German form), or is not used."""

from __future__ import annotations

import pytest

from pipeline.answer.completion import dropped_words


@pytest.mark.parametrize(
    ("message", "completed"),
    [
        ("And weeks 5 to 6?", "Who is the primary on-call engineer in weeks 5 to 6?"),
        ("Where do I find it?", "Where can one find the XT Shield after an upgrade?"),  # references replaced
        ("Wo finde ich diese Werte?", "Wo findet man die TPM-PCR-Werte in OpenXT?"),  # German stems
        ("Wie aktiviert man BATS?", "Wie aktiviert man BATS im OpenEmbedded build system?"),
        ("Which tests passed?", "Which OpenXT 9.0.2 tests did the Dell 9010 pass?"),  # English stems
        ("Und die TPM-PCR-Werte?", "Wo stehen die TPM PCR Werte in OpenXT?"),  # a compound's parts
        ("Thanks! And who owns it?", "Who owns the Windows build server?"),  # courtesy carries no question
        ("Danke, und wer ist dafür zuständig?", "Wer ist für die Windows-Builds zuständig?"),
        ("What is Alice's task?", "What is Alice's task from the RAG meeting in October?"),
    ],
)
def test_a_completion_may_add_context_and_replace_references(message: str, completed: str) -> None:
    assert dropped_words(message, completed) == []


@pytest.mark.parametrize(
    ("message", "completed", "dropped"),
    [  # Qwen2.5-0.5B on the dev split's German follow-ups
        ("Welche QEMU Version wurde für diese Tests genutzt?",
         "Wie viel RAM besaß der Host als FirePro V5900 mit XE2 kombiniert wurde?",
         ["qemu", "version", "tests", "genutzt"]),
        ("Welche Farbe bekommt das XT Shield nach einem Upgrade?",
         "Was hat das XT Shield nach einem Upgrade?", ["farbe", "bekommt"]),
        ("Betrifft dieser Bug 32-bit Windows?", "Was ist der Bug 32-bit Windows?", ["betrifft"]),
        # a follow-up that only changes a number or a letter: the earlier turn's question is no completion
        ("And weeks 5 to 6?", "Who is primary on call in weeks 3 to 4?", ["5", "6"]),
        ("Und Raum B?", "Wer sitzt in Raum A?", ["b"]),
    ],
)
def test_a_completion_that_drops_the_messages_words_names_them(
    message: str, completed: str, dropped: list[str]
) -> None:
    assert dropped_words(message, completed) == dropped
