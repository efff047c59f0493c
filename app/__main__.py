from app.cli import app

app(prog_name="eventgate")
