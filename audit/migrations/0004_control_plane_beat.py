from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0003_merge_0002_actor_type_scheduler_0002_sweep_mark"),
    ]

    operations = [
        migrations.CreateModel(
            name="ControlPlaneBeat",
            fields=[
                ("name", models.CharField(max_length=32, primary_key=True, serialize=False)),
                ("beat_at", models.DateTimeField()),
                ("serving_since", models.DateTimeField()),
                ("outage_began_at", models.DateTimeField(blank=True, null=True)),
            ],
        ),
    ]
