"""Documents for tests: hand-built PDFs (one page, Helvetica text, a valid xref) and Word files from
python-docx."""

from __future__ import annotations


def minimal_pdf(lines: list[str], title: str | None = None) -> bytes:
    """A one-page PDF whose text layer holds ``lines``; ``title`` goes into the document information."""

    def esc(t: str) -> str:
        return t.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")

    ops = ["BT", "/F1 12 Tf", "14 TL", "72 720 Td"] + [f"({esc(line)}) Tj T*" for line in lines] + ["ET"]
    stream = "\n".join(ops).encode("latin-1")
    objs = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 4 0 R >> >> "
        b"/Contents 5 0 R >>",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
    ]
    if title is not None:
        objs.append(b"<< /Title (" + esc(title).encode("latin-1") + b") >>")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objs, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    info = b" /Info %d 0 R" % len(objs) if title is not None else b""
    out += b"trailer\n<< /Size %d /Root 1 0 R%s >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, info, xref)
    return bytes(out)


def word_document() -> bytes:
    """A real .docx written by python-docx: title, heading, paragraph, bullet list and a table."""
    import io

    from docx import Document

    doc = Document()
    doc.core_properties.title = "On-call handbook"
    doc.add_heading("Escalation", level=1)
    doc.add_paragraph("Page the <duty> manager after 30 minutes.")
    doc.add_paragraph("check the dashboard", style="List Bullet")
    doc.add_paragraph("open an incident", style="List Bullet")
    table = doc.add_table(rows=2, cols=2)
    for (r, c), text in {(0, 0): "Service", (0, 1): "Owner", (1, 0): "billing", (1, 1): "Alice"}.items():
        table.cell(r, c).text = text
    out = io.BytesIO()
    doc.save(out)
    return out.getvalue()
